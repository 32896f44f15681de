"""Fused dequant + matvec for Q4_K in quant_pack's planar layout.

Built unlike the block kernels: every thread owns whole 32-element sub-blocks of a few rows (one
16-byte load each), dots them in registers and applies the sub-block's scale and min to its own
partial sums; the one cross-thread reduction is at the end. Per weight: a mask-or (the nibble into a
float mantissa), a subtraction and an FMA; nibbles 0-4 are taken in place and 5-7 after one shift per
word, their powers of 16 moved onto x. With PREFETCH each step issues the next step's loads before it
computes, so a thread keeps two steps of weights in flight instead of one.
"""

import triton
import triton.language as tl

from strata.kernels._bits import add_to_row3, exact_float, fp16_halves, row_at, split_range, store_rows
from strata.kernels.pdl import await_inputs
from strata.kernels.x_loads import load_x


@triton.jit
def _loads(
    qs_ptr, sc_ptr, mn_ptr, dm_ptr, rc, s, sv, stride_qs, stride_sc, stride_mn, stride_dm,
    SCALAR: tl.constexpr = False, PAIRED_DM: tl.constexpr = False, ROWS: tl.constexpr = 0,
):  # fmt: skip
    """The raw planes of sub-blocks s (NS,) of rows rc: words (BLOCK_N, NS, 4), sc, mn, d, dmin.

    SCALAR: the scales' offsets pass through a select, which hides their contiguity from Triton, so
    their loads are not vectorized and take the thread layout of the words' (one sub-block a thread):
    the products of words and scales then need no layout conversion (shared memory and two barriers)
    on every step. PAIRED_DM: dm_ptr is the dm plane's int32 view (stride_dm in words), and d, dmin
    (side by side, d in the low half) come from one 32-bit load instead of two 16-bit ones. The same
    values are loaded either way. ROWS: the planes are quant_pack's "rows" layout with ROWS rows a
    group (strides a group's; sc_ptr the scale records, mn_ptr 8 bytes into them): the same values,
    read through `row_at`."""
    ir = tl.arange(0, 4)
    if ROWS == 0:
        qs_at = qs_ptr + rc[:, None, None] * stride_qs + 4 * s[None, :, None] + ir[None, None, :]
    else:
        qs_at = qs_ptr + row_at(
            rc[:, None, None], 4 * s[None, :, None] + ir[None, None, :], stride_qs, ROWS, 4, 4
        )
    words = tl.load(qs_at, mask=sv[None, :, None], other=0)
    if SCALAR:
        s = tl.where(sv, s, 0)
    r2, s2 = rc[:, None], s[None, :]
    sc = tl.load(sc_ptr + row_at(r2, s2, stride_sc, ROWS, 8, 16), mask=sv[None, :], other=0)
    mn = tl.load(mn_ptr + row_at(r2, s2, stride_mn, ROWS, 8, 16), mask=sv[None, :], other=0)
    if PAIRED_DM:
        pair = tl.load(dm_ptr + row_at(r2, s2 // 8, stride_dm, ROWS, 1, 1), mask=sv[None, :], other=0)
        d, dmin = fp16_halves(pair)
    else:
        d = tl.load(dm_ptr + row_at(r2, (s2 // 8) * 2, stride_dm, ROWS, 2, 2), mask=sv[None, :], other=0)
        dmin = tl.load(
            dm_ptr + row_at(r2, (s2 // 8) * 2 + 1, stride_dm, ROWS, 2, 2), mask=sv[None, :], other=0
        )
    return words, sc, mn, d, dmin


@triton.jit
def _step(acc, x_ptr, up_ptr, stride_xm, s, sv, words, sc, mn, d, dmin,
          M: tl.constexpr, M_PAD: tl.constexpr, GATED: tl.constexpr):  # fmt: skip
    """acc (M_PAD, BLOCK_N, NS) += each row's dot with x over sub-blocks s, per sub-block; x as
    `x_loads.load_x` loads it."""
    ir = tl.arange(0, 4)
    upper = words >> 12  # nibbles 5-7 at bits 8-19 (the sign fill above bit 19 is masked off)
    d_sc = d.to(tl.float32) * exact_float(sc.to(tl.int32), 0)  # exact, as dequantize's d * sc
    d_mn = dmin.to(tl.float32) * exact_float(mn.to(tl.int32), 0)
    for m in tl.static_range(M):
        x_at = m * stride_xm + s[:, None] * 32 + ir[None, :]  # element 4i + r at + 4i
        dot = tl.zeros(words.shape, tl.float32)
        xsum = tl.zeros((s.shape[0], 4), tl.float32)
        for i in tl.static_range(8):
            xi = load_x(x_ptr, up_ptr, x_at + 4 * i, sv[:, None], GATED)
            xsum += xi
            # q * 16^p exactly from the nibble masked in place (p = i, or i - 3 after the shift);
            # x * 16^-p is exact too, so each product is q * x.
            p = i if i < 5 else i - 3
            src = words if i < 5 else upper
            q = exact_float(src & (15 << (4 * p)), 0)
            dot += q * (xi * (1.0 / (1 << (4 * p))))[None, :, :]
        part = d_sc * tl.sum(dot, 2) - d_mn * tl.sum(xsum, 1)[None, :]
        acc = add_to_row3(acc, part, m, M_PAD)
    return acc


@triton.jit
def q4_k_planar_matvec_kernel(
    x_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, qs_ptr, sc_ptr, mn_ptr, dm_ptr,
    N, K,
    stride_xm, stride_ys, stride_ym, stride_qs, stride_sc, stride_mn, stride_dm,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, PREFETCH: tl.constexpr, PAIRED_DM: tl.constexpr = False,
    up_ptr=None, GATED: tl.constexpr = False,
    PDL: tl.constexpr = False, ROWS: tl.constexpr = 0,
):  # fmt: skip
    """x as `x_loads.load_x` loads it: with GATED silu(x) * up, up laid out like x. PAIRED_DM, ROWS: see
    `_loads`."""
    await_inputs(PDL)
    # qs is the int32 view: sub-block s is words 4s..4s+3, and nibble i of word r is element 4i + r.
    NS: tl.constexpr = BLOCK_K // 32
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rc = tl.minimum(rows, N - 1)
    js = tl.arange(0, NS)
    lo, hi = split_range(K // 32, NS, SPLIT_K)
    strides = (stride_qs, stride_sc, stride_mn, stride_dm)
    acc = tl.zeros((M_PAD, BLOCK_N, NS), tl.float32)
    if PREFETCH:
        s = lo + js
        words, sc, mn, d, dmin = _loads(
            qs_ptr, sc_ptr, mn_ptr, dm_ptr, rc, s, s < hi, *strides, False, PAIRED_DM, ROWS
        )
        for s0 in range(lo, hi, NS):
            s = s0 + js
            # The next step's loads (masked off past the end) go out before this step computes.
            sn = s + NS
            w_n, sc_n, mn_n, d_n, dmin_n = _loads(
                qs_ptr, sc_ptr, mn_ptr, dm_ptr, rc, sn, sn < hi, *strides, False, PAIRED_DM, ROWS
            )
            acc = _step(acc, x_ptr, up_ptr, stride_xm, s, s < hi, words, sc, mn, d, dmin, M, M_PAD, GATED)
            words, sc, mn, d, dmin = w_n, sc_n, mn_n, d_n, dmin_n
    else:
        for s0 in range(lo, hi, NS):
            s = s0 + js
            sv = s < hi
            words, sc, mn, d, dmin = _loads(
                qs_ptr, sc_ptr, mn_ptr, dm_ptr, rc, s, sv, *strides, False, PAIRED_DM, ROWS
            )
            acc = _step(acc, x_ptr, up_ptr, stride_xm, s, sv, words, sc, mn, d, dmin, M, M_PAD, GATED)
    acc = tl.sum(acc, 2)
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym,
               M, M_PAD, b_ptr, HAS_BIAS, SPLIT_K)  # fmt: skip
