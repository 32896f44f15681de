"""The Q6_K prototype over planes regrouped by rows (`_matvec_q6k_rows`) against Q6_K's int8 kernel:
the same products per 16 elements (d * scale * dx * dot) summed in another order, so within fp32
rounding; ragged row counts (groups padded past n), splits 1-3, with and without prefetch."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.kernels._matvec_q6k_rows import Q6KRowsConfig, interleave_q6k_rows, q6_k_rows_int8_matvec  # noqa: E402
from strata.kernels.int8_inputs import quantize_x, use_asm  # noqa: E402
from strata.kernels.quant_matvec import MatvecConfig, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import pack_quant_weight  # noqa: E402
from strata.quant import dequantize  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, cuda_only, k_for, random_weight  # noqa: E402


def against_int8_kernel(n: int, k: int, rows: int, split: int, prefetch: bool) -> None:
    raw = random_weight(T.Q6_K, n, k, seed=n + k + rows)
    packed = pack_quant_weight(raw.to(DEVICE), T.Q6_K, n, k)
    x = torch.randn(1, k, device=DEVICE).bfloat16()
    x[0, 32:64] = 0  # an all-zero sub-block: its scale dx is 0
    want = quant_matvec(x, packed, T.Q6_K, n, k, config=MatvecConfig(16, 256, 1, int8_x=True)).double()
    xq, xd, _ = quantize_x(x, planar=False)
    out = torch.full((1, n), float("nan"), dtype=x.dtype, device=DEVICE)
    workspace = (
        torch.zeros(split, 1, n, device=DEVICE),
        torch.zeros(-(-n // rows), dtype=torch.int32, device=DEVICE),
    )
    planes = interleave_q6k_rows(packed.planes, rows)
    got = q6_k_rows_int8_matvec(
        xq, xd, planes, n, k, out, Q6KRowsConfig(rows, split, prefetch), use_asm=use_asm(x),
        workspace=workspace if split > 1 else None,
    ).double()  # fmt: skip
    assert torch.isfinite(got).all(), "an output row was not written"
    bound = x.double().abs() @ dequantize(raw, T.Q6_K, (n, k)).double().abs().T.to(DEVICE)
    assert (got - want).abs().le(2 * torch.finfo(torch.bfloat16).eps * want.abs() + 1e-5 * bound).all()


@pytest.mark.parametrize(
    "n,blocks,rows,split,prefetch",
    [(40, 2, 32, 1, False), (70, 3, 64, 2, True), (33, 1, 32, 2, False), (96, 3, 32, 3, True)],
)
def test_q6k_rows_kernel_matches_the_int8_kernel(n, blocks, rows, split, prefetch):
    against_int8_kernel(n, k_for(T.Q6_K, blocks), rows, split, prefetch)


@cuda_only
@pytest.mark.parametrize("n,k", [(3584, 18944), (512, 3584), (1536, 8960)])
@pytest.mark.parametrize("rows,split,prefetch", [(64, 1, False), (128, 4, True), (32, 32, True)])
def test_q6k_rows_kernel_model_shapes_cuda(n: int, k: int, rows: int, split: int, prefetch: bool):
    against_int8_kernel(n, k, rows, split, prefetch)
