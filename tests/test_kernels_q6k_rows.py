"""Q6_K's "rows" layout (quant_pack, STRATA_Q6K_LAYOUT) and its int8 matvec (`_matvec_q6k_rows`). The
kernel against Q6_K's int8 kernel over the blocks layout: the same products per 16 elements (d * scale
* dx * dot) summed in another order, so within fp32 rounding; ragged row counts (groups padded past
n), splits 1-3, with and without prefetch, one x row and several, bias and the residual add. Every
other path on the layout (fp32 x, the fused matmul, `dequantize_packed`, the embedding lookup)
against the blocks layout, bit for bit; the layers stacking it, the regrouping and its inverse."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata import env  # noqa: E402
from strata.kernels._matvec_q6k_rows import Q6KRowsConfig, q6_k_rows_int8_matvec, q6k_rows_config  # noqa: E402
from strata.kernels.dequant_packed import dequantize_packed  # noqa: E402
from strata.kernels.int8_inputs import quantize_x, use_asm  # noqa: E402
from strata.kernels.quant_matvec import MatvecConfig, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import (  # noqa: E402
    ROWS,
    deinterleave_q6k_rows,
    interleave_q6k_rows,
    pack_quant_weight,
)
from strata.layers.linear import Projections, QuantLinear  # noqa: E402
from strata.layers.placement import Placement  # noqa: E402
from strata.quant import dequantize  # noqa: E402
from tests.test_kernels_q4k_rows import same_through_matmul_and_dequantization  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, cuda_only, k_for, random_weight  # noqa: E402


def close(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> bool:
    """Both round fp32 sums once to bf16: at most one bf16 ulp apart, plus fp32 reordering (bounded by
    |x| @ |W|^T)."""
    diff = (got.double() - want.double()).abs()
    return bool(diff.le(2 * torch.finfo(torch.bfloat16).eps * want.double().abs() + 1e-5 * bound(x, w)).all())


def bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.double().abs() @ w.double().abs().T


def against_int8_kernel(n: int, k: int, m: int, rows: int, split: int, prefetch: bool, bias: bool) -> None:
    raw = random_weight(T.Q6_K, n, k, seed=n + k + rows + m)
    packed = pack_quant_weight(raw.to(DEVICE), T.Q6_K, n, k, q6k_layout="blocks")
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    x[0, 32:64] = 0  # an all-zero sub-block: its scale dx is 0
    b = torch.randn(n, device=DEVICE).bfloat16() if bias else None
    cfg = MatvecConfig(16, 256, 1, int8_x=True)
    want = quant_matvec(x, packed, T.Q6_K, n, k, config=cfg, bias=b)
    xq, xd, _ = quantize_x(x, planar=False)
    # A view of a wider tensor: the kernel and its workspace keep out's row stride.
    wide = torch.full((m, n + 5), float("nan"), dtype=x.dtype, device=DEVICE)
    workspace = (
        torch.zeros(split, m, n + 5, device=DEVICE),
        torch.zeros(-(-n // rows), dtype=torch.int32, device=DEVICE),
    )
    planes = interleave_q6k_rows(packed.planes, rows)
    got = q6_k_rows_int8_matvec(
        xq, xd, planes, n, k, wide[:, :n], Q6KRowsConfig(rows, split, prefetch), bias=b, use_asm=use_asm(x),
        workspace=workspace if split > 1 else None,
    )  # fmt: skip
    assert torch.isfinite(got).all(), "an output row was not written"
    assert wide[:, n:].isnan().all(), "written past the view"
    assert close(got, want, x, dequantize(raw, T.Q6_K, (n, k)).to(DEVICE))
    if split > 1:  # the counters are left at zero for the next launch
        assert int(workspace[1].abs().sum()) == 0


@pytest.mark.parametrize(
    "n,blocks,m,rows,split,prefetch,bias",
    [
        (40, 2, 1, 32, 1, False, False),
        (70, 3, 1, 64, 2, True, True),
        (33, 1, 3, 32, 2, False, True),
        (96, 3, 2, 32, 3, True, False),
        (70, 2, 16, 64, 1, True, False),
        (40, 3, 1, 32, 6, False, False),  # one half a program (as the 0.5B's down at split 38)
        (40, 3, 1, 32, 4, True, False),  # 2 halves a split: the last split empty
    ],
)
def test_q6k_rows_kernel_matches_the_int8_kernel(n, blocks, m, rows, split, prefetch, bias):
    against_int8_kernel(n, k_for(T.Q6_K, blocks), m, rows, split, prefetch, bias)


@cuda_only
@pytest.mark.parametrize("n,k", [(3584, 18944), (512, 3584), (1536, 8960), (896, 4864)])
@pytest.mark.parametrize(
    "rows,split,prefetch", [(64, 1, False), (128, 4, True), (32, 32, True), (64, 38, False)]
)
@pytest.mark.parametrize("m", [1, 4])
def test_q6k_rows_kernel_model_shapes_cuda(n: int, k: int, rows: int, split: int, prefetch: bool, m: int):
    against_int8_kernel(n, k, m, rows, split, prefetch, bias=False)


def layouts(n: int, k: int, seed: int):
    raw = random_weight(T.Q6_K, n, k, seed=seed).to(DEVICE)
    blocks = pack_quant_weight(raw, T.Q6_K, n, k, q6k_layout="blocks")
    rows = pack_quant_weight(raw, T.Q6_K, n, k, q6k_layout="rows")
    assert rows.layout == "rows" and rows.rows_group == ROWS and not rows.planar
    assert blocks.layout == "blocks"
    return blocks, rows


def test_interleave_q6k_rows_moves_bytes_only():
    n, k, rows = 37, k_for(T.Q6_K, 3), 32
    packed = pack_quant_weight(random_weight(T.Q6_K, n, k, seed=5), T.Q6_K, n, k, q6k_layout="blocks")
    ql, qh, sc, d = interleave_q6k_rows(packed.planes, rows)
    # Row r's 16-byte unit u of ql sits at (group, u, r % rows); its scales' 8-byte unit likewise.
    r, u = 35, 13
    g, i = divmod(r, rows)
    assert torch.equal(ql.view(2, -1, rows, 16)[g, u, i], packed.planes[0].view(n, -1, 16)[r, u])
    assert torch.equal(qh.view(2, -1, rows, 16)[g, 7, i], packed.planes[1].view(n, -1, 16)[r, 7])
    assert torch.equal(sc.view(2, -1, rows, 8)[g, 5, i], packed.planes[2].view(n, -1, 8)[r, 5])
    assert torch.equal(d.view(2, -1, rows)[g, 2, i], packed.planes[3][r, 2])
    assert int(ql.view(2, -1, rows, 16)[1, :, n - rows :].abs().sum()) == 0  # padding is zero
    back = deinterleave_q6k_rows((ql, qh, sc, d), n, rows)
    assert all(torch.equal(a, b) for a, b in zip(back, packed.planes, strict=True))


@pytest.mark.parametrize("m", [1, 3])
def test_q6k_rows_layout_through_quant_matvec(m: int):
    # 16-bit x: the rows kernel (its own launch), within fp32 reordering; fp32 x: the fp32 kernel
    # through `row_at`, bit for bit; a MatvecConfig for the int8 kernel is refused with the fix.
    n, k = 70, k_for(T.Q6_K, 2)
    blocks, rows = layouts(n, k, seed=m)
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    w = dequantize_packed(blocks, torch.float32)
    assert close(quant_matvec(x, rows, T.Q6_K, n, k), quant_matvec(x, blocks, T.Q6_K, n, k), x, w)
    xf = x.float()
    assert torch.equal(quant_matvec(xf, rows, T.Q6_K, n, k), quant_matvec(xf, blocks, T.Q6_K, n, k))
    cfg = MatvecConfig(16, 256, 2)
    got = quant_matvec(xf, rows, T.Q6_K, n, k, config=cfg)
    assert torch.equal(got, quant_matvec(xf, blocks, T.Q6_K, n, k, config=cfg))
    with pytest.raises(ValueError, match="config=None"):
        quant_matvec(x, rows, T.Q6_K, n, k, config=MatvecConfig(16, 256, 1, int8_x=True))


def test_q6k_rows_layout_through_the_matmul_and_dequantization():
    blocks, rows = layouts(100, k_for(T.Q6_K, 2), seed=9)
    same_through_matmul_and_dequantization(rows, blocks)


def test_q6k_rows_layout_on_the_layers(monkeypatch):
    # A stack of two Q6_K projections (a group spans both: 40 rows each) in each layout: the same
    # outputs within the kernels' tolerance. (An embedding's lookup is `dequantize_packed` with rows.)
    n, k = 40, k_for(T.Q6_K, 2)
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    made = {}
    for layout in ("rows", "blocks"):
        monkeypatch.setenv("STRATA_Q6K_LAYOUT", layout)
        parts = {
            name: QuantLinear(random_weight(T.Q6_K, n, k, seed=7 + i), T.Q6_K, (n, k), place)
            for i, name in enumerate("gu")
        }
        stacked = Projections(parts, place).parts["g+u"]
        assert isinstance(stacked, QuantLinear) and stacked.packed is not None
        assert stacked.packed.layout == layout
        made[layout] = stacked
    rows_layer, blocks_layer = made["rows"], made["blocks"]
    assert blocks_layer.packed is not None
    w = dequantize_packed(blocks_layer.packed, torch.float32)
    for m in (1, 2):
        x = torch.randn(m, k, device=DEVICE).bfloat16()
        assert close(rows_layer(x), blocks_layer(x), x, w)


def test_q6k_rows_config_fills_the_gpu():
    # The H100 sweep's best at 64 rows: the 7B's v and down split 32, its output head unsplit with
    # prefetch; at most one split a half (128 elements).
    assert q6k_rows_config(512, 3584, 64, 132) == Q6KRowsConfig(64, 32, False)
    assert q6k_rows_config(3584, 18944, 64, 132) == Q6KRowsConfig(64, 32, False)
    assert q6k_rows_config(152064, 3584, 64, 132) == Q6KRowsConfig(64, 1, True)
    # STRATA_Q6K_HALVES: halves a program; the 0.5B's down has 38 halves
    assert q6k_rows_config(896, 4864, 64, 132) == Q6KRowsConfig(64, 32, False)
    assert q6k_rows_config(896, 4864, 64, 132, 1) == Q6KRowsConfig(64, 38, False)
    assert q6k_rows_config(896, 4864, 64, 132, 3) == Q6KRowsConfig(64, 13, False)
    assert q6k_rows_config(896, 4864, 64, 132, 64) == Q6KRowsConfig(64, 1, True)
    assert q6k_rows_config(64, 256, 64, 132).split_k == 2


def test_q6k_layout_setting(monkeypatch):
    monkeypatch.delenv("STRATA_Q6K_LAYOUT", raising=False)
    assert env.q6k_layout() == "rows"
    monkeypatch.setenv("STRATA_Q6K_LAYOUT", "planar")
    with pytest.raises(ValueError, match="STRATA_Q6K_LAYOUT='planar'.*blocks or rows"):
        env.q6k_layout()
    raw = random_weight(T.Q6_K, 4, 256, seed=1)
    with pytest.raises(ValueError, match="q6k_layout must be one of"):
        pack_quant_weight(raw, T.Q6_K, 4, 256, q6k_layout="planar")
