"""RMSNorm of decode rows with their int8 quantization for the int8 matvecs, in one launch.

`rms_norm_int8` returns what `rms_norm` followed by `quant_matvec.quantize_x` (per order) returns, bit
for bit: program (row, j) takes the whole row's sum of squares exactly as `rms_norm`'s program does
(the same tile and warps, so the same reduction order and the same 1 / rms), then normalizes and
quantizes only the row's sub-blocks j * 32 .. j * 32 + 31, as `quantize_x` spreads a row over
programs. The residual add is written out of place (the row's other programs still read the old
residual), and the caller carries the new residual on.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels._int8_x import Int8X, empty_int8_x, store_int8
from strata.kernels.int8_inputs import use_asm
from strata.kernels.pdl import await_inputs, launch_args
from strata.kernels.rms_norm import _MAX_BLOCK, _load_row, check_inputs, inverse_rms, warps_for

_SUBS_PER_PROGRAM = 32  # as quantize_x


@triton.jit
def _rms_norm_int8_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, new_r_ptr, qp_ptr, dp_ptr, sp_ptr, qe_ptr, de_ptr, se_ptr,
    H, eps, stride_x, stride_r, stride_o, stride_n,
    BLOCK: tl.constexpr, NSB: tl.constexpr, HAS_RESIDUAL: tl.constexpr, INT8: tl.constexpr,
    USE_ASM: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """INT8 bit 1: Q4_K's planar order into qp/dp/sp; bit 2: element order into qe/de/se."""
    await_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    x_row, r_row = x_ptr + row * stride_x, r_ptr + row * stride_r
    cols = tl.arange(0, BLOCK)
    v = _load_row(x_row, r_row, cols, cols < H, HAS_RESIDUAL)
    inv_rms = inverse_rms(tl.sum(v * v, 0), H, eps)
    n_sub = H // 32
    s = tl.program_id(1) * NSB + tl.arange(0, NSB)
    sv = s < n_sub
    at = s[:, None] * 32 + tl.arange(0, 32)[None, :]
    part = _load_row(x_row, r_row, at, sv[:, None], HAS_RESIDUAL)  # (NSB, 32), as v's elements
    if HAS_RESIDUAL:
        tl.store(new_r_ptr + row * stride_n + at, part.to(new_r_ptr.dtype.element_ty), mask=sv[:, None])
    w = tl.load(w_ptr + at, mask=sv[:, None], other=0.0).to(tl.float32)
    h = (part * inv_rms * w).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + at, h, mask=sv[:, None])
    h = h.to(tl.float32)
    words, subs = row * n_sub * 8, row * n_sub
    if INT8 & 1:
        store_int8(h, s, sv, qp_ptr + words, dp_ptr + subs, sp_ptr + subs, NSB, True, USE_ASM)
    if INT8 & 2:
        store_int8(h, s, sv, qe_ptr + words, de_ptr + subs, se_ptr + subs, NSB, False, USE_ASM)


def takes(x: torch.Tensor) -> bool:
    """Whether `rms_norm_int8` takes x: 16-bit (rows, H), H whole sub-blocks in one tile."""
    hidden = x.shape[-1]
    return x.dim() == 2 and x.dtype != torch.float32 and hidden % 32 == 0 and hidden <= _MAX_BLOCK


def rms_norm_int8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    orders: tuple[bool, ...],
    *,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, dict[bool, Int8X]]:
    """(out, new_residual, int8) for a 16-bit (rows, H) x, H a multiple of 32 up to 8,192: out and the
    residual as `rms_norm(x, weight, eps, residual=...)` leaves them, but the updated residual in a new
    tensor (None without `residual`, which is not changed), and for each of `orders` (True: Q4_K's
    planar order, False: element order) what `int8_inputs.quantize_x(out, planar)` returns."""
    check_inputs(x, weight, eps, residual)
    hidden = x.shape[-1]
    if not takes(x):
        raise ValueError(
            f"rms_norm_int8 takes a 16-bit (rows, H) x with H a multiple of 32 up to {_MAX_BLOCK}; got "
            f"{tuple(x.shape)} {x.dtype} (use rms_norm, then quantize_x)"
        )
    rows, subs = x.shape[0], hidden // 32
    out = torch.empty_like(x)
    new_residual = None if residual is None else torch.empty_like(residual)
    int8 = {planar: empty_int8_x(rows, subs, x.device) for planar in orders}
    if rows == 0:
        return out, new_residual, int8
    r = x if residual is None else residual
    nr = out if new_residual is None else new_residual
    block = triton.next_power_of_2(hidden)
    _rms_norm_int8_kernel[(rows, triton.cdiv(subs, _SUBS_PER_PROGRAM))](
        x, r, weight, out, nr, *int8.get(True, (out,) * 3), *int8.get(False, (out,) * 3),
        hidden, float(eps), x.stride(0), r.stride(0), out.stride(0), nr.stride(0),
        BLOCK=block, NSB=_SUBS_PER_PROGRAM, HAS_RESIDUAL=residual is not None,
        INT8=(True in int8) + 2 * (False in int8), USE_ASM=use_asm(x), num_warps=warps_for(block),
        # Compiled as rms_norm is (FMA contraction on), for its sum of squares; store_int8 rounds alike
        # either way.
        **launch_args(x.device),
    )  # fmt: skip
    return out, new_residual, int8
