"""The row-interleaved Q4_K int8 matvec (`_matvec_q4k_rows`) against the planar int8 kernel it
regroups: the same per-sub-block products summed in another order, so within fp32 rounding of the
sum; ragged row counts (groups padded past n), splits 1-3, steps that do and do not cover K evenly.
And its opt-in copy on the layers (STRATA_Q4K_ROWS): one-row matvecs read it, wider ones do not."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.kernels._matvec_q4k_rows import (  # noqa: E402
    ROWS,
    RowsConfig,
    interleave_rows,
    q4_k_rows_int8_matvec,
    rows_config,
    with_rows,
)
from strata.kernels.dequant_packed import dequantize_packed  # noqa: E402
from strata.kernels.int8_inputs import quantize_x, use_asm  # noqa: E402
from strata.kernels.quant_matvec import MatvecConfig, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import pack_quant_weight  # noqa: E402
from strata.layers.linear import Projections, QuantLinear  # noqa: E402
from strata.layers.placement import Placement  # noqa: E402
from strata.quant import dequantize  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, cuda_only, k_for, random_weight  # noqa: E402


def rows_against_planar(
    n: int, k: int, rows: int, step: int, split: int, warps: int, xvec: bool = False, prefetch: bool = False
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
    y = q4_k_rows_int8_matvec(
        *quantize_x(x, planar=True), planes, n, k, out, RowsConfig(rows, step, split, warps, xvec, prefetch),
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
    pad = 2 * rows - n
    sub, blk = k // 32, k // 256
    # Row r's sub-block s words sit at (group, s, r % rows); its block's scales at (group, b, r % rows).
    r, s = 35, 17
    g, i = divmod(r, rows)
    assert torch.equal(
        qs.view(2, sub, rows, 4)[g, s, i], packed.planes[0].view(torch.int32).view(n, sub, 4)[r, s]
    )
    b, j = divmod(s, 8)
    assert scm.view(2, blk, rows, 16)[g, b, i, j] == packed.planes[1][r, s]
    assert scm.view(2, blk, rows, 16)[g, b, i, 8 + j] == packed.planes[2][r, s]
    assert dm.view(2, blk, rows)[g, b, i] == packed.planes[3].view(torch.int32)[r, b]
    # Padding is zero and nothing else was added.
    assert qs.numel() * 4 == packed.planes[0].numel() * (n + pad) // n
    assert int(qs.view(2, sub, rows, 4)[1, :, n - rows :].abs().sum()) == 0


def q4k_layers(monkeypatch, rows_copy: bool, n: int, k: int, seed: int) -> tuple[QuantLinear, QuantLinear]:
    """A Q4_K layer of n rows and a stack of two (q and k of a projection), with or without the
    row-interleaved copy (STRATA_Q4K_ROWS)."""
    monkeypatch.setenv("STRATA_Q4K_ROWS", "1" if rows_copy else "0")
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(seed))  # qwen2's q, k, v have one
    one = QuantLinear(random_weight(T.Q4_K, n, k, seed=seed), T.Q4_K, (n, k), place, bias)
    parts = {
        name: QuantLinear(random_weight(T.Q4_K, n, k, seed=seed + i), T.Q4_K, (n, k), place)
        for i, name in enumerate("qk")
    }
    stacked = Projections(parts, place).parts["q+k"]
    assert isinstance(stacked, QuantLinear)
    return one, stacked


def test_rows_copy_serves_one_row_only(monkeypatch):
    n, k = 40, k_for(T.Q4_K, 3)
    with_copy = q4k_layers(monkeypatch, True, n, k, seed=3)
    without = q4k_layers(monkeypatch, False, n, k, seed=3)
    for a, b in zip(with_copy, without, strict=True):
        assert a.packed is not None and a.packed.rows is not None and a.packed.rows_group == ROWS
        assert b.packed is not None and b.packed.rows is None
        # The stacked layer's copy is regrouped from its stacked planes: row r of q+k is row r.
        x = torch.randn(1, a.in_features, device=DEVICE).bfloat16()
        bound = x.double().abs() @ dequantize_packed(b.packed, torch.float32).double().abs().T
        got, want = a(x).double(), b(x).double()
        assert (got - want).abs().le(2 * torch.finfo(torch.bfloat16).eps * want.abs() + 1e-5 * bound).all()
        # The residual add in the store, as the planar kernel adds it.
        base = torch.randn(1, a.out_features, device=DEVICE).bfloat16()
        added = a(x, add_to=base.clone()).double()
        assert (added - b(x, add_to=base.clone()).double()).abs().le(0.02 * added.abs() + 1e-5 * bound).all()
        # Two rows take the planar kernels: exactly the layer without the copy.
        x2 = torch.randn(2, a.in_features, device=DEVICE).bfloat16()
        assert torch.equal(a(x2), b(x2))


def test_rows_copy_needs_the_planar_layout():
    packed = pack_quant_weight(random_weight(T.Q8_0, 4, 64, seed=1), T.Q8_0, 4, 64)
    with pytest.raises(ValueError, match="made from Q4_K's planar layout, not Q8_0"):
        with_rows(packed)


def test_rows_config_fills_the_gpu():
    # About 32 warps per SM: a narrow weight splits K (at most 8 ways, a super-block each at least).
    assert rows_config(37888, 3584, 64, 132).split_k == 4
    assert rows_config(3584, 18944, 64, 132).split_k == 8
    assert rows_config(1536, 512, 64, 132).split_k == 2
    assert rows_config(151936, 3584, 64, 132).split_k == 1
