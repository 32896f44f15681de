"""Q6_K matvec on int8 activations (dp4a), the Q6_K counterpart of `_matvec_q4k_int8`.

x is quantized per 32 elements in element order (`_int8_x`, PLANAR off). Q6_K's elements of one
32-element sub-block s (0..3) of a 128-element half g sit in consecutive bytes: their low 4 bits are
the low (s < 2) or high nibbles of ql bytes 64g + 32(s % 2) + i, their high 2 bits bits 2s, 2s + 1 of
qh bytes 32g + i. So one word of ql and one of qh give four consecutive 6-bit values, q in 0..63; the
weight is q - 32, made per byte without borrows as ((q | 0x80) - 32) ^ 0x80, and meets four x bytes
in one signed dp4a. Each 16 elements share an int8 scale: y += d * scale * dx * sum(q - 32 times xq).
The result differs from the fp32 product by at most sum_k |w_k| * dx_k / 2, plus fp32 rounding.
"""

import triton
import triton.language as tl

from strata.kernels._bits import split_range, store_rows
from strata.kernels._int8_x import _dot_rows, _x_rows


@triton.jit
def _weights_minus_32(ql, qh, s: tl.constexpr):
    """Sub-block s's words of q - 32 as signed bytes, from its ql and its half's qh words (int32)."""
    q = ((ql >> (4 * (s // 2))) & 0x0F0F0F0F) | (((qh >> (2 * s)) & 0x03030303) << 4)
    # Bytes are 0..63: with the top bit set first, subtracting 32 borrows from no neighbour.
    w = ((q.to(tl.uint32, bitcast=True) | 0x80808080) - 0x20202020) ^ 0x80808080
    return w.to(tl.int32, bitcast=True)


@triton.jit
def q6_k_int8_matvec_kernel(
    xq_ptr, xd_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, ql_ptr, qh_ptr, sc_ptr, d_ptr,
    N, K,
    stride_ys, stride_ym, stride_ql, stride_qh, stride_sc, stride_d,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, USE_ASM: tl.constexpr,
):  # fmt: skip
    """ql_ptr and qh_ptr are int32 views (stride in words); every row of x at once (M_PAD of them)."""
    NH: tl.constexpr = BLOCK_K // 128
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rc1 = tl.minimum(rows, N - 1)
    rc = rc1[:, None, None]
    j = tl.arange(0, 8)[None, None, :]
    n_sub = K // 32
    lo, hi = split_range(K // 128, NH, SPLIT_K)
    acc = tl.zeros((M_PAD, BLOCK_N), tl.float32)
    for g0 in range(lo, hi, NH):
        g = g0 + tl.arange(0, NH)
        gv = g < hi
        g3 = g[None, :, None]
        m3 = gv[None, :, None]
        qh = tl.load(qh_ptr + rc * stride_qh + g3 * 8 + j, mask=m3, other=0)  # (BLOCK_N, NH, 8)
        d = tl.load(d_ptr + rc1[:, None] * stride_d + (g // 2)[None, :], mask=gv[None, :], other=0)
        d = d.to(tl.float32)[:, :, None]
        for s in tl.static_range(4):
            ql = tl.load(ql_ptr + rc * stride_ql + g3 * 16 + 8 * (s % 2) + j, mask=m3, other=0)
            x, dx = _x_rows(xq_ptr, xd_ptr, 4 * g + s, gv, n_sub, M, M_PAD)  # x's sub-block 4g + s
            dot = _dot_rows(_weights_minus_32(ql, qh, s), x, USE_ASM)  # (M_PAD, BLOCK_N, NH, 8)
            dot16 = tl.sum(tl.reshape(dot, (M_PAD, BLOCK_N, NH, 2, 4)), 4)  # per 16 elements
            sc_at = sc_ptr + rc * stride_sc + g3 * 8 + 2 * s + tl.arange(0, 2)[None, None, :]
            sc = tl.load(sc_at, mask=m3, other=0)
            scale = d * sc.to(tl.float32)  # (BLOCK_N, NH, 2): exact, as dequantize's d * sc
            part = tl.sum(scale[None, :, :, :] * dot16.to(tl.float32), 3) * dx[:, None, :]
            acc += tl.sum(part, 2)
    store_rows(
        y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym, M, M_PAD, b_ptr, HAS_BIAS, SPLIT_K
    )
