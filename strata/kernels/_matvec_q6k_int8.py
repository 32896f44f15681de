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
from strata.kernels._int8_x import _dp4a
from strata.kernels.pdl import await_inputs


@triton.jit
def _weights_minus_32(ql, qh, s: tl.constexpr):
    """Sub-block s's words of q - 32 as signed bytes, from its ql and its half's qh words (int32)."""
    q = ((ql >> (4 * (s // 2))) & 0x0F0F0F0F) | (((qh >> (2 * s)) & 0x03030303) << 4)
    # Bytes are 0..63: with the top bit set first, subtracting 32 borrows from no neighbour.
    w = ((q.to(tl.uint32, bitcast=True) | 0x80808080) - 0x20202020) ^ 0x80808080
    return w.to(tl.int32, bitcast=True)


@triton.jit
def _group_dots(w, x, USE_ASM: tl.constexpr):
    """Sums of q - 32 times x per 16 elements: w (BLOCK_N, NH, 2, 4) weight words, x (M_PAD, NH, 2, 4)
    every row's x words -> (M_PAD, BLOCK_N, NH, 2), or (BLOCK_N, NH, 2) for one row, whose x is
    reshaped rather than broadcast along a fifth axis (which converted the weights' layout each step)."""
    if x.shape[0] == 1:
        a, b = tl.broadcast(w, tl.reshape(x, x.shape[1:]))
        dots = tl.sum(_dp4a(a, b, tl.zeros_like(a), USE_ASM, SIGNED_A=True), 3)  # (BLOCK_N, NH, 2)
    else:
        a, b = tl.broadcast(w[None, :, :, :, :], x[:, None, :, :, :])
        dots = tl.sum(_dp4a(a, b, tl.zeros_like(a), USE_ASM, SIGNED_A=True), 4)
    return dots


@triton.jit
def _weights(planes, rc1, g, gv, word, SCALAR_SCALES: tl.constexpr):
    """The quants of 128-element halves g (NH,) of rows rc1: qh and the ql words of sub-blocks 0 and 1
    (BLOCK_N, NH, 2, 4; 2 and 3 are their high nibbles), the four sub-blocks' scales (BLOCK_N, NH, 2)
    and d, (BLOCK_N, NH, 2) fp32 with SCALAR_SCALES (one load for each scale, in their layout), else
    (BLOCK_N, NH, 1)."""
    ql_ptr, qh_ptr, sc_ptr, d_ptr, stride_ql, stride_qh, stride_sc, stride_d = planes
    rc = rc1[:, None, None, None]
    g4 = g[None, :, None, None]
    m4 = gv[None, :, None, None]
    qh = tl.load(qh_ptr + rc * stride_qh + g4 * 8 + word, mask=m4, other=0)
    ql_at = ql_ptr + rc * stride_ql + g4 * 16 + word
    ql0 = tl.load(ql_at, mask=m4, other=0)
    ql1 = tl.load(ql_at + 8, mask=m4, other=0)
    d = _d(d_ptr, rc1, stride_d, g, gv, SCALAR_SCALES)
    sc_at = sc_ptr + rc1[:, None, None] * stride_sc
    sc_off = g[None, :, None] * 8 + tl.arange(0, 2)[None, None, :]
    if SCALAR_SCALES:
        sc_off = tl.where(gv[None, :, None], sc_off, 0)
    sm = gv[None, :, None]
    sc0 = tl.load(sc_at + sc_off, mask=sm, other=0)
    sc1 = tl.load(sc_at + sc_off + 2, mask=sm, other=0)
    sc2 = tl.load(sc_at + sc_off + 4, mask=sm, other=0)
    sc3 = tl.load(sc_at + sc_off + 6, mask=sm, other=0)
    return qh, ql0, ql1, sc0, sc1, sc2, sc3, d


@triton.jit
def _d(d_ptr, rc1, stride_d, g, gv, SCALAR_SCALES: tl.constexpr):
    """The super-block scales d of halves g, fp32: (BLOCK_N, NH, 2) with SCALAR_SCALES (in the layout of
    the sub-block scales: one load for each of the two), else (BLOCK_N, NH, 1)."""
    if SCALAR_SCALES:
        two = tl.zeros((1, 1, 2), tl.int32)
        d_at = d_ptr + rc1[:, None, None] * stride_d + (g // 2)[None, :, None] + two
        d = tl.load(d_at, mask=gv[None, :, None], other=0).to(tl.float32)
    else:
        d = tl.load(d_ptr + rc1[:, None] * stride_d + (g // 2)[None, :], mask=gv[None, :], other=0)
        d = d.to(tl.float32)[:, :, None]
    return d


@triton.jit
def _products(acc, x, g, gv, word, qh, ql, sc, d, M: tl.constexpr, M_PAD: tl.constexpr, NH: tl.constexpr,
              USE_ASM: tl.constexpr):  # fmt: skip
    """acc plus the scaled dot products of one step's halves g with every row of x, sub-block by
    sub-block; x is (xq_ptr, xd_ptr, mi, n_sub), ql (two) and sc (four) as `_weights` loads them."""
    xq_ptr, xd_ptr, mi, n_sub = x
    for s in tl.static_range(4):
        # x's sub-block 4g + s for every row: (M_PAD, NH, 2, 4) words and (M_PAD, NH) scales dx.
        ok = (mi < M)[:, None] & gv[None, :]
        sub = (4 * g + s)[None, :]
        xw_at = xq_ptr + (mi[:, None] * n_sub + sub)[:, :, None, None] * 8 + word
        xw = tl.load(xw_at, mask=ok[:, :, None, None], other=0)
        dx = tl.load(xd_ptr + mi[:, None] * n_sub + sub, mask=ok, other=0)
        dot16 = _group_dots(_weights_minus_32(ql[s % 2], qh, s), xw, USE_ASM)  # (M_PAD, BLOCK_N, NH, 2)
        scale = d * sc[s].to(tl.float32)  # (BLOCK_N, NH, 2): exact, as dequantize's d * sc
        if M_PAD == 1:
            acc += scale * dot16.to(tl.float32) * tl.reshape(dx, (NH,))[None, :, None]
        else:
            acc += scale[None, :, :, :] * dot16.to(tl.float32) * dx[:, None, :, None]
    return acc


@triton.jit
def q6_k_int8_matvec_kernel(
    xq_ptr, xd_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, ql_ptr, qh_ptr, sc_ptr, d_ptr,
    N, K,
    stride_ys, stride_ym, stride_ql, stride_qh, stride_sc, stride_d,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, USE_ASM: tl.constexpr,
    SCALAR_SCALES: tl.constexpr = False,
    PREFETCH: tl.constexpr = False,
    PDL: tl.constexpr = False, PRELOAD: tl.constexpr = False,
):  # fmt: skip
    """ql_ptr and qh_ptr are int32 views (stride in words); every row of x at once (M_PAD of them).
    The products of each 16 elements are kept per (row, half, 16 elements) across the whole K loop and
    summed once at the end: no cross-thread reduction and no layout conversion of a 16-element group
    inside the loop (a group's four words are one thread's 16-byte load). SCALAR_SCALES: the scales'
    offsets pass through a select that hides their contiguity (and d is loaded once per scale), so
    their loads take the layout of the products: at 32 x 512 tiles this leaves out four layout
    conversions per step (eight barriers); the same sums. PREFETCH: each step's weight loads (ql, qh,
    scales, d) go out before the step before it computes, two steps in flight per thread (Triton
    pipelines no load of a loop without a dot); the same sums. PRELOAD: PREFETCH's loop, its first
    step's weights loaded before `await_inputs` (weights are never written by a kernel); the same sums."""
    NH: tl.constexpr = BLOCK_K // 128
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rc1 = tl.minimum(rows, N - 1)
    word = tl.arange(0, 2)[None, None, :, None] * 4 + tl.arange(0, 4)[None, None, None, :]  # group, word
    mi = tl.arange(0, M_PAD)
    n_sub = K // 32
    lo, hi = split_range(K // 128, NH, SPLIT_K)
    planes = (ql_ptr, qh_ptr, sc_ptr, d_ptr, stride_ql, stride_qh, stride_sc, stride_d)
    if not PRELOAD:
        await_inputs(PDL)
    if PREFETCH or PRELOAD:  # the first step's weights
        g = lo + tl.arange(0, NH)
        qh, ql0, ql1, sc0, sc1, sc2, sc3, d = _weights(planes, rc1, g, g < hi, word, SCALAR_SCALES)
    if PRELOAD:  # the wait after the first step's weight loads went out
        await_inputs(PDL)
    # One row of x: a (BLOCK_N, NH, 2) accumulator, in the layout of the step's sums.
    acc = (
        tl.zeros((BLOCK_N, NH, 2), tl.float32)
        if M_PAD == 1
        else tl.zeros((M_PAD, BLOCK_N, NH, 2), tl.float32)
    )
    x = (xq_ptr, xd_ptr, mi, n_sub)
    if PREFETCH or PRELOAD:
        for g0 in range(lo, hi, NH):
            g = g0 + tl.arange(0, NH)
            gn = g + NH  # the next step's loads (masked off past the end)
            qh_n, ql0_n, ql1_n, sc0_n, sc1_n, sc2_n, sc3_n, d_n = _weights(
                planes, rc1, gn, gn < hi, word, SCALAR_SCALES
            )
            acc = _products(acc, x, g, g < hi, word, qh, (ql0, ql1), (sc0, sc1, sc2, sc3), d, M, M_PAD, NH,
                            USE_ASM)  # fmt: skip
            qh, ql0, ql1, d = qh_n, ql0_n, ql1_n, d_n
            sc0, sc1, sc2, sc3 = sc0_n, sc1_n, sc2_n, sc3_n
    else:
        # The measured loop, its loads between its products (kept until the prefetching one is timed).
        rc = rc1[:, None, None, None]
        for g0 in range(lo, hi, NH):
            g = g0 + tl.arange(0, NH)
            gv = g < hi
            g4 = g[None, :, None, None]
            m4 = gv[None, :, None, None]
            qh = tl.load(qh_ptr + rc * stride_qh + g4 * 8 + word, mask=m4, other=0)  # (BLOCK_N, NH, 2, 4)
            d = _d(d_ptr, rc1, stride_d, g, gv, SCALAR_SCALES)
            for s in tl.static_range(4):
                ql = tl.load(ql_ptr + rc * stride_ql + g4 * 16 + 8 * (s % 2) + word, mask=m4, other=0)
                # x's sub-block 4g + s for every row: (M_PAD, NH, 2, 4) words and (M_PAD, NH) scales dx.
                ok = (mi < M)[:, None] & gv[None, :]
                sub = (4 * g + s)[None, :]
                x_at = xq_ptr + (mi[:, None] * n_sub + sub)[:, :, None, None] * 8 + word
                xw = tl.load(x_at, mask=ok[:, :, None, None], other=0)
                dx = tl.load(xd_ptr + mi[:, None] * n_sub + sub, mask=ok, other=0)
                dot16 = _group_dots(_weights_minus_32(ql, qh, s), xw, USE_ASM)  # (M_PAD, BLOCK_N, NH, 2)
                sc_off = g[None, :, None] * 8 + 2 * s + tl.arange(0, 2)[None, None, :]
                if SCALAR_SCALES:
                    sc_off = tl.where(gv[None, :, None], sc_off, 0)
                sc_at = sc_ptr + rc1[:, None, None] * stride_sc + sc_off
                sc = tl.load(sc_at, mask=gv[None, :, None], other=0)
                scale = d * sc.to(tl.float32)  # (BLOCK_N, NH, 2): exact, as dequantize's d * sc
                if M_PAD == 1:
                    acc += scale * dot16.to(tl.float32) * tl.reshape(dx, (NH,))[None, :, None]
                else:
                    acc += scale[None, :, :, :] * dot16.to(tl.float32) * dx[:, None, :, None]
    acc = tl.sum(tl.sum(acc, 2), 1)[None, :] if M_PAD == 1 else tl.sum(tl.sum(acc, 3), 2)
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym,
               M, M_PAD, b_ptr, HAS_BIAS, SPLIT_K)  # fmt: skip
