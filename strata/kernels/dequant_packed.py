"""Dequantize a packed GGUF weight to a dense fp16 / bf16 / fp32 matrix on the device.

For many rows (long prefills, wide batches) a matmul is compute-bound, and cuBLAS on a dense weight
runs the tensor cores far better than the fused dequant + tl.dot kernel does (benchmarks/gpu_matmul.py:
0.15-0.6x of cuBLAS there): writing the dense weight once costs about as much as reading it twice,
which is small next to the matmul at a few hundred rows. The decoding is the fused matmul's own
(`_group_scales`, `_group_quants`, in 16-element groups), so the values are bit-equal to
`strata.quant.dequantize` before the final rounding to the output dtype.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from strata.kernels._matmul_quant import (
    Q4_K,
    Q4_K_PLANAR,
    Q4_K_ROWS,
    ROWS_GROUP,
    _bf16_in_f32,
    _group_quants,
    _group_scales,
    _planar_quants,
    kernel_type,
)
from strata.kernels.pdl import await_inputs, launch_args
from strata.kernels.quant_matmul import MATMUL_TYPES, _kernel_args
from strata.kernels.quant_pack import PackedQuantWeight

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _dequant_kernel(
    out_ptr, rows_ptr, p0_ptr, p1_ptr, p2_ptr, p3_ptr,
    N, K, stride_out, s0, s1, s2, s3,
    QTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROUND_BF16: tl.constexpr,
    GATHER: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Output rows rn are weight rows rn, or with GATHER weight rows rows[rn] (N is then len(rows))."""
    await_inputs(PDL)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rc = tl.minimum(rn, N - 1)
    if GATHER:
        rc = tl.load(rows_ptr + rc).to(tl.int32)
    NT: tl.constexpr = BLOCK_K // 16
    # Groups past K repeat the last one (valid bytes); their elements are not stored.
    t3 = tl.minimum(tl.program_id(1) * NT + tl.arange(0, NT), K // 16 - 1)[None, :, None]
    r3 = rc[:, None, None]
    i3 = tl.arange(0, 16)[None, None, :]
    mul, sub = _group_scales(QTYPE, p0_ptr, p1_ptr, p2_ptr, p3_ptr, r3, t3, s0, s1, s2, s3)
    if QTYPE == Q4_K_PLANAR or QTYPE == Q4_K_ROWS:  # noqa: SIM109 (constexpr comparisons)
        R: tl.constexpr = ROWS_GROUP if QTYPE == Q4_K_ROWS else 0
        first = tl.program_id(1) * (BLOCK_K // 32)
        q = _planar_quants(p0_ptr, rc, first, K // 32 - 1, s0, BLOCK_N, BLOCK_K, R)
    else:
        q = _group_quants(QTYPE, p0_ptr, p1_ptr, r3, t3, i3, s0, s1)
    with_min = QTYPE == Q4_K or QTYPE == Q4_K_PLANAR or QTYPE == Q4_K_ROWS  # noqa: SIM109
    w = tl.reshape(mul * q - sub if with_min else mul * q, (BLOCK_N, BLOCK_K))
    if ROUND_BF16:
        w = _bf16_in_f32(w)
    kk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    ptrs = out_ptr + rn.to(tl.int64)[:, None] * stride_out + kk[None, :]
    tl.store(ptrs, w.to(out_ptr.dtype.element_ty), mask=(rn[:, None] < N) & (kk[None, :] < K))


def dequantize_packed(
    w: PackedQuantWeight,
    dtype: torch.dtype,
    *,
    out: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    block_n: int = 32,
    block_k: int = 256,
) -> torch.Tensor:
    """The (n, k) weight in `dtype`: strata.quant.dequantize's float32 values rounded once to `dtype`;
    with `rows` (integer indices on the weight's device, each in [0, n); not checked, as that would
    sync), only those rows, in that order: (len(rows), k), an embedding lookup.

    `out`, when given, is a contiguous-row tensor of that shape and `dtype` on the weight's device,
    written in place. No host-device sync: capturable in a CUDA graph.
    """
    if not isinstance(w, PackedQuantWeight):
        raise TypeError(f"w must be a PackedQuantWeight from pack_quant_weight, got {type(w).__name__}")
    if w.qtype not in MATMUL_TYPES:
        supported = ", ".join(t.name for t in sorted(MATMUL_TYPES))
        raise ValueError(f"no packed dequantization for GGML type {w.qtype.name}; supported: {supported}")
    if dtype not in _OUT_DTYPES:
        raise TypeError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
    if block_n < 1 or block_n & (block_n - 1) or block_k < 16 or block_k & (block_k - 1):
        raise ValueError(f"block_n must be a power of two and block_k one >= 16, got {block_n}, {block_k}")
    if rows is not None and (rows.dim() != 1 or rows.is_floating_point() or rows.device != w.device):
        raise ValueError(
            f"rows must be a 1-D integer tensor on {w.device}, "
            f"got {tuple(rows.shape)} {rows.dtype} on {rows.device}"
        )
    n = w.n if rows is None else rows.shape[0]
    if out is None:
        out = torch.empty(n, w.k, dtype=dtype, device=w.device)
    elif out.shape != (n, w.k) or out.dtype != dtype or out.stride(1) != 1 or out.device != w.device:
        raise ValueError(
            f"out must be a ({n}, {w.k}) {dtype} tensor on {w.device} with contiguous rows, "
            f"got {tuple(out.shape)} {out.dtype} on {out.device}"
        )
    if n == 0:
        return out
    planes, strides = _kernel_args(w)
    grid = (triton.cdiv(n, block_n), triton.cdiv(w.k, block_k))
    # Triton's interpreter truncates fp32 -> bf16 casts; round to nearest even by hand there.
    round_bf16 = dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    if w.planar and block_k < 32:
        raise ValueError(f"Q4_K's {w.layout} layout needs block_k >= 32, got {block_k}")
    _dequant_kernel[grid](
        out, out if rows is None else rows, *planes, n, w.k, out.stride(0), *strides,
        QTYPE=kernel_type(int(w.qtype), w.layout), BLOCK_N=block_n, BLOCK_K=block_k, ROUND_BF16=round_bf16,
        GATHER=rows is not None,
        # No FMA contraction: d * q - dmin * mn must round as dequantize rounds it.
        enable_fp_fusion=False,
        **launch_args(out.device),
    )  # fmt: skip
    return out
