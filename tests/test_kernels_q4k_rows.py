"""Q4_K's "rows" layout (quant_pack) and its one-row int8 matvec (`_matvec_q4k_rows`). The kernel
against the planar int8 kernel it regroups: the same per-sub-block products summed in another order,
so within fp32 rounding of the sum; ragged row counts (groups padded past n), splits 1-3, steps that
do and do not cover K evenly. Every other path on the layout (the planar kernels through `row_at`:
wider matvecs, fp32 x, the fused matmul, `dequantize_packed`) against the planar layout, bit for bit;
the layers stacking it (q+k) and the layout's regrouping and its inverse."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.kernels._matvec_q4k_rows import RowsConfig, q4_k_rows_int8_matvec, rows_config  # noqa: E402
from strata.kernels.dequant_packed import dequantize_packed  # noqa: E402
from strata.kernels.int8_inputs import quantize_x, use_asm  # noqa: E402
from strata.kernels.quant_matmul import MatmulConfig, quant_matmul  # noqa: E402
from strata.kernels.quant_matvec import MatvecConfig, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import (  # noqa: E402
    ROWS,
    PackedQuantWeight,
    deinterleave_rows,
    interleave_rows,
    pack_quant_weight,
)
from strata.layers.linear import Projections, QuantLinear  # noqa: E402
from strata.layers.placement import Placement  # noqa: E402
from strata.quant import dequantize  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, cuda_only, k_for, random_weight  # noqa: E402


def rows_against_planar(
    n: int,
    k: int,
    rows: int,
    step: int,
    split: int,
    warps: int,
    xvec: bool = False,
    prefetch: bool = False,
    subs: int = 8,
) -> None:
    raw = random_weight(T.Q4_K, n, k, seed=n * 31 + k + rows)
    packed = pack_quant_weight(raw.to(DEVICE), T.Q4_K, n, k, "planar")
    x = torch.randn(1, k, device=DEVICE).bfloat16()
    x[0, 64:96] = 0  # an all-zero sub-block: its scale dx is 0
    planar = quant_matvec(x, packed, T.Q4_K, n, k, config=MatvecConfig(8, 256, 1, int8_x=True, flat_acc=True))
    out = torch.full((1, n), float("nan"), dtype=x.dtype, device=DEVICE)
    groups = -(-n // rows)
    workspace = (
        torch.zeros(split, 1, n, device=DEVICE),
        torch.zeros(groups, dtype=torch.int32, device=DEVICE),
    )
    planes = interleave_rows(packed.planes, rows)
    cfg = RowsConfig(rows, step, split, warps, xvec, prefetch, subs=subs)
    y = q4_k_rows_int8_matvec(
        *quantize_x(x, planar=True), planes, n, k, out, cfg,
        use_asm=use_asm(x),
        workspace=workspace if split > 1 else None,
    )  # fmt: skip
    assert torch.isfinite(y).all(), "an output row was not written"
    w = dequantize(raw, T.Q4_K, (n, k)).double().to(DEVICE)
    scale = x.double().abs() @ w.abs().T
    # Both round their fp32 sums once to bf16: at most one bf16 ulp apart, plus fp32 reordering.
    diff = (y.double() - planar.double()).abs()
    assert (diff <= 2 * torch.finfo(torch.bfloat16).eps * planar.double().abs() + 1e-5 * scale).all()
    if split > 1:  # the counters are left at zero for the next launch
        assert int(workspace[1].abs().sum()) == 0


@pytest.mark.parametrize(
    "n,blocks,rows,step,split,warps",
    [
        (37, 5, 32, 1, 1, 1),  # 27 padded rows in the last group
        (64, 5, 32, 2, 2, 2),  # a step past K's end (masked), split 2
        (72, 6, 64, 2, 3, 4),  # even steps, split 3
        (33, 3, 32, 4, 1, 4),  # one step longer than K
    ],
)
@pytest.mark.parametrize("xvec,prefetch", [(False, False), (True, False), (False, True), (True, True)])
def test_rows_kernel_matches_the_planar_int8_kernel(n, blocks, rows, step, split, warps, xvec, prefetch):
    rows_against_planar(n, k_for(T.Q4_K, blocks), rows, step, split, warps, xvec, prefetch)


# A lane on half or a quarter of a super-block (more lanes on short rows): units that start inside a
# super-block's scale record, steps past K's end (masked) and even ones.
@pytest.mark.parametrize(
    "n,blocks,step,split,subs,prefetch",
    [(37, 3, 1, 1, 4, False), (64, 3, 2, 2, 2, True), (72, 2, 2, 3, 4, True), (33, 3, 4, 1, 2, False)],
)
def test_rows_kernel_on_parts_of_super_blocks(n, blocks, step, split, subs, prefetch):
    rows_against_planar(n, k_for(T.Q4_K, blocks), 32, step, split, step, prefetch=prefetch, subs=subs)


@cuda_only
@pytest.mark.parametrize("n,k", [(4608, 3584), (2048, 1536)])
@pytest.mark.parametrize("subs,split", [(4, 4), (2, 8)])
def test_rows_kernel_on_parts_of_super_blocks_cuda(n: int, k: int, subs: int, split: int):
    rows_against_planar(n, k, 64, 1, split, 2, subs=subs)


@cuda_only
@pytest.mark.parametrize("n,k", [(4608, 3584), (37888, 3584), (3584, 18944), (1536, 8960)])
@pytest.mark.parametrize("rows,step,split", [(64, 1, 2), (128, 1, 1), (32, 2, 4)])
@pytest.mark.parametrize("xvec,prefetch", [(False, False), (True, True)])
def test_rows_kernel_model_shapes_cuda(
    n: int, k: int, rows: int, step: int, split: int, xvec: bool, prefetch: bool
):
    rows_against_planar(n, k, rows, step, split, rows // 32 * step, xvec, prefetch)


def test_interleave_rows_moves_bytes_only():
    n, k, rows = 37, k_for(T.Q4_K, 3), 32
    packed = pack_quant_weight(random_weight(T.Q4_K, n, k, seed=5), T.Q4_K, n, k, "planar")
    qs, scm, dm = interleave_rows(packed.planes, rows)
    sub, blk = k // 32, k // 256
    # Row r's sub-block s words sit at (group, s, r % rows); its block's scales at (group, b, r % rows).
    r, s = 35, 17
    g, i = divmod(r, rows)
    assert torch.equal(qs.view(2, sub, rows, 16)[g, s, i], packed.planes[0].view(n, sub, 16)[r, s])
    b, j = divmod(s, 8)
    assert scm.view(2, blk, rows, 16)[g, b, i, j] == packed.planes[1][r, s]
    assert scm.view(2, blk, rows, 16)[g, b, i, 8 + j] == packed.planes[2][r, s]
    assert torch.equal(dm.view(2, blk, rows, 2)[g, b, i], packed.planes[3].view(n, blk, 2)[r, b])
    # Padding is zero, and the inverse gives the planar planes back.
    assert int(qs.view(2, sub, rows, 16)[1, :, n - rows :].abs().sum()) == 0
    back = deinterleave_rows((qs, scm, dm), n, rows)
    assert all(torch.equal(a, b) for a, b in zip(back, packed.planes, strict=True))


def layouts(n: int, k: int, seed: int):
    raw = random_weight(T.Q4_K, n, k, seed=seed).to(DEVICE)
    planar = pack_quant_weight(raw, T.Q4_K, n, k, "planar")
    rows = pack_quant_weight(raw, T.Q4_K, n, k, "rows")
    assert rows.layout == "rows" and rows.rows_group == ROWS and rows.planar
    return planar, rows


# The planar kernels read the "rows" layout through `row_at`: the same values in the same order.
@pytest.mark.parametrize(
    "m,dtype,config",
    [
        (3, torch.bfloat16, MatvecConfig(16, 256, 1, int8_x=True)),  # the planar int8 kernel
        (1, torch.float32, None),  # fp32 x
        (2, torch.float32, MatvecConfig(8, 256, 2, prefetch=True, paired_dm=True)),
        (1, torch.bfloat16, MatvecConfig(8, 512, 3, int8_x=True, flat_acc=True, scalar_scales=True)),
    ],
    ids=str,
)
def test_rows_layout_through_the_planar_matvecs(m: int, dtype: torch.dtype, config: MatvecConfig | None):
    n, k = 100, k_for(T.Q4_K, 3)
    planar, rows = layouts(n, k, seed=m)
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    want = quant_matvec(x, planar, T.Q4_K, n, k, config=config)
    assert torch.equal(quant_matvec(x, rows, T.Q4_K, n, k, config=config), want)


@pytest.mark.parametrize("m,split", [(2, 1), (3, 3), (16, 2)])
def test_rows_kernel_on_several_x_rows(m: int, split: int):
    # Each x row's sums as the planar int8 kernel's, within fp32 reordering; the workspace keeps out's
    # row stride (here a view with a wider one).
    n, k = 70, k_for(T.Q4_K, 3)
    planar, rows = layouts(n, k, seed=m)
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    want = quant_matvec(x, planar, T.Q4_K, n, k, config=MatvecConfig(16, 256, 1, int8_x=True)).double()
    wide = torch.full((m, n + 6), float("nan"), dtype=x.dtype, device=DEVICE)
    cfg = RowsConfig(ROWS, 1, split, ROWS // 32, prefetch=True)
    workspace = (
        torch.zeros(split, m, n + 6, device=DEVICE),
        torch.zeros(2, dtype=torch.int32, device=DEVICE),
    )
    got = q4_k_rows_int8_matvec(
        *quantize_x(x, planar=True), rows.planes, n, k, wide[:, :n], cfg, use_asm=use_asm(x),
        workspace=workspace if split > 1 else None,
    ).double()  # fmt: skip
    bound = x.double().abs() @ dequantize_packed(planar, torch.float32).double().abs().T
    assert torch.isfinite(got).all()
    assert (got - want).abs().le(2 * torch.finfo(torch.bfloat16).eps * want.abs() + 1e-5 * bound).all()
    assert wide[:, n:].isnan().all()  # nothing written past the view


def same_through_matmul_and_dequantization(rows: PackedQuantWeight, other: PackedQuantWeight) -> None:
    """The fused matmul (split K), the dequantizer and its row gather (an embedding lookup: rows of
    both groups, the last padded) give the same values, bit for bit, on 100 rows in two layouts."""
    x = torch.randn(20, rows.k, device=DEVICE).bfloat16()
    cfg = MatmulConfig(16, 32, 64, split_k=2)
    assert torch.equal(quant_matmul(x, rows, config=cfg), quant_matmul(x, other, config=cfg))
    assert torch.equal(dequantize_packed(rows, torch.float32), dequantize_packed(other, torch.float32))
    ids = torch.tensor([99, 0, 64, 63], device=DEVICE)
    assert torch.equal(
        dequantize_packed(rows, torch.bfloat16, rows=ids), dequantize_packed(other, torch.bfloat16, rows=ids)
    )


def test_rows_layout_through_the_matmul_and_dequantization():
    planar, rows = layouts(100, k_for(T.Q4_K, 2), seed=9)
    same_through_matmul_and_dequantization(rows, planar)


def q4k_layers(monkeypatch, layout: str, n: int, k: int, seed: int) -> tuple[QuantLinear, QuantLinear]:
    """A Q4_K layer of n rows with a bias (as qwen2's q, k, v have) and a stack of two (q and k of a
    projection, n rows each: with n not a multiple of ROWS a group spans both), in `layout`."""
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", layout)
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    one = QuantLinear(random_weight(T.Q4_K, n, k, seed=seed), T.Q4_K, (n, k), place, bias)
    parts = {
        name: QuantLinear(random_weight(T.Q4_K, n, k, seed=seed + i), T.Q4_K, (n, k), place)
        for i, name in enumerate("qk")
    }
    stacked = Projections(parts, place).parts["q+k"]
    assert isinstance(stacked, QuantLinear)
    return one, stacked


def test_rows_layout_on_the_layers(monkeypatch):
    n, k = 40, k_for(T.Q4_K, 3)
    rows = q4k_layers(monkeypatch, "rows", n, k, seed=3)
    planar = q4k_layers(monkeypatch, "planar", n, k, seed=3)
    for a, b in zip(rows, planar, strict=True):
        assert a.packed is not None and a.packed.layout == "rows"
        assert b.packed is not None and b.packed.layout == "planar"
        # One row: the rows kernel, within fp32 reordering of the planar int8 kernel.
        x = torch.randn(1, a.in_features, device=DEVICE).bfloat16()
        bound = x.double().abs() @ dequantize_packed(b.packed, torch.float32).double().abs().T
        got, want = a(x).double(), b(x).double()
        assert (got - want).abs().le(2 * torch.finfo(torch.bfloat16).eps * want.abs() + 1e-5 * bound).all()
        # Two rows: the rows kernel with both x rows on each step's words.
        x2 = torch.randn(2, a.in_features, device=DEVICE).bfloat16()
        bound2 = x2.double().abs() @ dequantize_packed(b.packed, torch.float32).double().abs().T
        got2, want2 = a(x2).double(), b(x2).double()
        assert (
            (got2 - want2).abs().le(2 * torch.finfo(torch.bfloat16).eps * want2.abs() + 1e-5 * bound2).all()
        )


def test_rows_config_fills_the_gpu():
    # The splits the H100 sweep found best on the 7B (gate+up, down, q+k+v, o): about 16 warps per
    # SM, at most 32 ways and about two super-blocks a split; no prefetch.
    assert rows_config(37888, 3584, 64, 132).split_k == 2
    assert rows_config(3584, 18944, 64, 132).split_k == 32
    assert rows_config(4608, 3584, 64, 132).split_k == 8
    assert rows_config(3584, 3584, 64, 132).split_k == 8
    assert rows_config(1536, 512, 64, 132).split_k == 1
    assert rows_config(151936, 3584, 64, 132).split_k == 1
    assert not rows_config(3584, 18944, 64, 132).prefetch


def test_auto_layout_packs_by_size_and_stacks_only_alike(monkeypatch):
    from strata.kernels.quant_pack import ROWS_FROM, ROWS_FROM_K

    def auto(n: int, k: int) -> str:  # shapes only: the bytes are zeros
        zeros = torch.zeros(n, k // 256 * 144, dtype=torch.uint8)
        return pack_quant_weight(zeros, T.Q4_K, n, k, "auto").layout

    k = k_for(T.Q4_K, 2)
    assert auto(4, k) == "planar"
    assert auto(ROWS_FROM // (k // 256), k) == "rows"  # just large enough
    assert auto(ROWS_FROM // (k // 256) - 1, k) == "planar"
    assert auto(2, ROWS_FROM_K) == "rows"  # long rows (a down projection's)
    assert auto(2, ROWS_FROM_K - 256) == "planar"
    # Layers of one input whose parts took different layouts stay apart (stacking would mix planes).
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    a = QuantLinear(random_weight(T.Q4_K, 8, k, seed=2), T.Q4_K, (8, k), place)
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "rows")
    b = QuantLinear(random_weight(T.Q4_K, 8, k, seed=3), T.Q4_K, (8, k), place)
    assert set(Projections({"q": a, "k": b}, place).parts) == {"q", "k"}
    c = QuantLinear(random_weight(T.Q4_K, 8, k, seed=4), T.Q4_K, (8, k), place)
    assert set(Projections({"k": b, "v": c}, place).parts) == {"k+v"}
