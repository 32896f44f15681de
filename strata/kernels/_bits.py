"""Bit helpers shared by the Triton kernels."""

import triton
import triton.language as tl


@triton.jit
def exact_float(u, BIAS: tl.constexpr):
    """float32(u) - BIAS for int32 0 <= u < 2**23, without an int-to-float conversion.

    ORing u into the mantissa of 2**23 gives the float 2**23 + u exactly; one subtraction removes
    2**23 and the bias. This costs two full-rate ALU ops, where I2F runs at a quarter rate on sm_90
    and would cap a 4-bit matvec below HBM bandwidth.
    """
    return (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + BIAS)


@triton.jit
def split_range(num_units, UNITS: tl.constexpr, SPLIT_K: tl.constexpr):
    """[lo, hi) of the K units (blocks, chunks) this program's split covers; lo is a multiple of UNITS."""
    per_split = tl.cdiv(tl.cdiv(num_units, SPLIT_K), UNITS) * UNITS
    lo = tl.program_id(1) * per_split
    return lo, tl.minimum(lo + per_split, num_units)


@triton.jit
def add_to_row(acc, part, m: tl.constexpr, M_PAD: tl.constexpr):
    """acc[m, :] += part for an (M_PAD, BLOCK_N) accumulator and a (BLOCK_N,) partial sum."""
    if M_PAD == 1:
        out = acc + part[None, :]
    else:
        out = acc + tl.where(tl.arange(0, M_PAD)[:, None] == m, part[None, :], 0.0)
    return out


@triton.jit
def add_to_row3(acc, part, m: tl.constexpr, M_PAD: tl.constexpr):
    """acc[m, :, :] += part for an (M_PAD, BLOCK_N, NS) accumulator and a (BLOCK_N, NS) partial sum."""
    if M_PAD == 1:
        out = acc + part[None, :, :]
    else:
        out = acc + tl.where(tl.arange(0, M_PAD)[:, None, None] == m, part[None, :, :], 0.0)
    return out


@triton.jit
def store_rows(
    y_ptr,
    acc,
    rows,
    N,
    stride_ys,
    stride_ym,
    M: tl.constexpr,
    M_PAD: tl.constexpr,
    b_ptr,
    HAS_BIAS: tl.constexpr,
):
    """Write the (M_PAD, BLOCK_N) accumulator to y[split, m, rows] (the split stride is 0 without split-K),
    plus the bias b[rows] when there is one: added by split 0 only, so the split sum adds it once, and
    before the one rounding to y's dtype."""
    if HAS_BIAS:
        bias = tl.load(b_ptr + rows, mask=rows < N, other=0).to(tl.float32)
        acc += tl.where(tl.program_id(1) == 0, bias, 0.0)[None, :]
    mi = tl.arange(0, M_PAD)
    ptrs = y_ptr + tl.program_id(1) * stride_ys + mi[:, None] * stride_ym + rows[None, :]
    tl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=(mi[:, None] < M) & (rows[None, :] < N))
