"""Q4_K (planar layout) matvec on int8 activations: four products per instruction with dp4a.

The fp32 kernels spend several instructions per weight (unpack, convert, multiply-add) and Nsight
Compute shows them compute- and L1-bound at a fifth of HBM bandwidth. Here x is first quantized per
32-element sub-block to int8 with one fp32 scale, as llama.cpp's CUDA backend does (its q8_1), and a
word of eight nibbles meets its x with two masks and two dp4a (integer dot products of four bytes).

`quantize_x_kernel` writes, per row and sub-block: dx = max|x| / 127, q = round(x / dx) in [-127,
127], the exact fp32 sum of x (the min term needs sum(x), not sum(q) * dx), and q packed to match the
planar weights: nibble i of weight word r is element 4i + r, so word w & 0x0F0F0F0F holds elements
r, 8 + r, 16 + r, 24 + r and (w >> 4) & 0x0F0F0F0F holds 4 + r, 12 + r, 20 + r, 28 + r. The x words
are (lo r = 0..3, hi r = 0..3), eight per sub-block.

The result differs from the fp32 product by at most sum_k |w_k| * dx_k / 2 (each q is x / dx
rounded to nearest) plus fp32 rounding: comparable to rounding x to bf16 first.
"""

import triton
import triton.language as tl

from strata.kernels._bits import add_to_row3, exact_float, split_range, store_rows
from strata.kernels._matvec_q4k_planar import _loads


@triton.jit
def quantize_x_kernel(x_ptr, xq_ptr, xd_ptr, xs_ptr, K, stride_xm, NSB: tl.constexpr):
    """Program (m, j) quantizes sub-blocks j * NSB .. of row m."""
    m = tl.program_id(0)
    s = tl.program_id(1) * NSB + tl.arange(0, NSB)
    sv = s < K // 32
    e = tl.arange(0, 32)
    x = tl.load(x_ptr + m * stride_xm + s[:, None] * 32 + e[None, :], mask=sv[:, None], other=0)
    x = x.to(tl.float32)
    amax = tl.max(tl.abs(x), 1)
    # Correctly rounded divisions (the GPU's default fp32 `/` is approximate), so that the interpreter
    # and the GPU round every x alike; no 1 / 0, even where unused.
    inv = tl.where(
        amax > 0, tl.math.div_rn(tl.full(amax.shape, 127.0, tl.float32), tl.maximum(amax, 1e-30)), 0.0
    )
    v = x * inv[:, None]
    q = (v + tl.where(v >= 0, 0.5, -0.5)).to(tl.int32)  # round half away from zero
    # Element e = 8b + 4h + r goes to byte b of x word (h, r).
    b = tl.reshape(q & 255, (NSB, 4, 8)) << (8 * tl.arange(0, 4))[None, :, None]
    words = tl.sum(b, 1)  # (NSB, 8): word 4h + r; the shifted bytes do not overlap
    n_sub = K // 32
    tl.store(xq_ptr + m * n_sub * 8 + s[:, None] * 8 + tl.arange(0, 8)[None, :], words, mask=sv[:, None])
    tl.store(
        xd_ptr + m * n_sub + s,
        tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)).to(tl.float32),
        mask=sv,
    )
    tl.store(xs_ptr + m * n_sub + s, tl.sum(x, 1), mask=sv)


@triton.jit
def _dp4a(a, b, c, USE_ASM: tl.constexpr):
    """c + sum over the four bytes of a (unsigned) times those of b (signed)."""
    if USE_ASM:
        out = tl.inline_asm_elementwise(
            "dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32, is_pure=True, pack=1
        )
    else:  # Triton's interpreter runs no PTX: the same integer arithmetic, byte by byte
        out = c
        for i in tl.static_range(4):
            out += ((a >> (8 * i)) & 255) * ((((b >> (8 * i)) & 255) ^ 128) - 128)
    return out


@triton.jit
def q4_k_int8_matvec_kernel(
    xq_ptr, xd_ptr, xs_ptr, y_ptr, b_ptr, qs_ptr, sc_ptr, mn_ptr, dm_ptr,
    N, K,
    stride_ys, stride_ym, stride_qs, stride_sc, stride_mn, stride_dm,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, USE_ASM: tl.constexpr, ROWS_AT_ONCE: tl.constexpr,
):  # fmt: skip
    NS: tl.constexpr = BLOCK_K // 32
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rc = tl.minimum(rows, N - 1)
    js = tl.arange(0, NS)
    n_sub = K // 32
    lo, hi = split_range(n_sub, NS, SPLIT_K)
    acc = tl.zeros((M_PAD, BLOCK_N, NS), tl.float32)
    for s0 in range(lo, hi, NS):
        s = s0 + js
        sv = s < hi
        words, sc, mn, d, dmin = _loads(
            qs_ptr, sc_ptr, mn_ptr, dm_ptr, rc, s, sv, stride_qs, stride_sc, stride_mn, stride_dm
        )  # words (BLOCK_N, NS, 4)
        w_lo = words & 0x0F0F0F0F
        w_hi = (words >> 4) & 0x0F0F0F0F
        d_sc = d.to(tl.float32) * exact_float(sc.to(tl.int32), 0)
        d_mn = dmin.to(tl.float32) * exact_float(mn.to(tl.int32), 0)
        if ROWS_AT_ONCE:
            acc += _all_rows(xq_ptr, xd_ptr, xs_ptr, s, sv, n_sub, w_lo, w_hi, d_sc, d_mn, M, M_PAD, USE_ASM)
        else:
            acc = _row_by_row(
                acc, xq_ptr, xd_ptr, xs_ptr, s, sv, n_sub, w_lo, w_hi, d_sc, d_mn, M, M_PAD, USE_ASM
            )
    store_rows(y_ptr, tl.sum(acc, 2), rows, N, stride_ys, stride_ym, M, M_PAD, b_ptr, HAS_BIAS)


@triton.jit
def _row_by_row(acc, xq_ptr, xd_ptr, xs_ptr, s, sv, n_sub, w_lo, w_hi, d_sc, d_mn, M: tl.constexpr,
                M_PAD: tl.constexpr, USE_ASM: tl.constexpr):  # fmt: skip
    """acc (M_PAD, BLOCK_N, NS) += each row's products with the step's words, one row after another
    (each added through a select over the whole accumulator: work grows as M squared)."""
    ir = tl.arange(0, 4)
    for m in tl.static_range(M):
        xq_at = xq_ptr + m * n_sub * 8 + s[:, None] * 8 + ir[None, :]
        x_lo = tl.broadcast_to(tl.load(xq_at, mask=sv[:, None], other=0)[None, :, :], w_lo.shape)  # (NS, 4)
        x_hi = tl.broadcast_to(tl.load(xq_at + 4, mask=sv[:, None], other=0)[None, :, :], w_lo.shape)
        dot = _dp4a(w_lo, x_lo, tl.zeros(w_lo.shape, tl.int32), USE_ASM)
        dot = _dp4a(w_hi, x_hi, dot, USE_ASM)
        xd = tl.load(xd_ptr + m * n_sub + s, mask=sv, other=0)
        xs = tl.load(xs_ptr + m * n_sub + s, mask=sv, other=0)
        part = d_sc * (tl.sum(dot, 2).to(tl.float32) * xd[None, :]) - d_mn * xs[None, :]
        acc = add_to_row3(acc, part, m, M_PAD)
    return acc


@triton.jit
def _all_rows(xq_ptr, xd_ptr, xs_ptr, s, sv, n_sub, w_lo, w_hi, d_sc, d_mn, M: tl.constexpr,
              M_PAD: tl.constexpr, USE_ASM: tl.constexpr):  # fmt: skip
    """The step's (M_PAD, BLOCK_N, NS) partial sums for every row at once, by broadcasting: the same
    per-row arithmetic as `_row_by_row` (so the same sums, bit for bit), with work linear in M."""
    mi = tl.arange(0, M_PAD)
    valid = (mi < M)[:, None] & sv[None, :]  # (M_PAD, NS)
    xq_at = xq_ptr + mi[:, None, None] * n_sub * 8 + s[None, :, None] * 8
    xq_at += tl.arange(0, 4)[None, None, :]
    shape = (M_PAD, w_lo.shape[0], w_lo.shape[1], 4)
    x_lo = tl.broadcast_to(tl.load(xq_at, mask=valid[:, :, None], other=0)[:, None, :, :], shape)
    x_hi = tl.broadcast_to(tl.load(xq_at + 4, mask=valid[:, :, None], other=0)[:, None, :, :], shape)
    dot = _dp4a(tl.broadcast_to(w_lo[None, :, :, :], shape), x_lo, tl.zeros(shape, tl.int32), USE_ASM)
    dot = _dp4a(tl.broadcast_to(w_hi[None, :, :, :], shape), x_hi, dot, USE_ASM)
    xd = tl.load(xd_ptr + mi[:, None] * n_sub + s[None, :], mask=valid, other=0)
    xs = tl.load(xs_ptr + mi[:, None] * n_sub + s[None, :], mask=valid, other=0)
    dots = tl.sum(dot, 3).to(tl.float32)
    return d_sc[None, :, :] * (dots * xd[:, None, :]) - d_mn[None, :, :] * xs[:, None, :]
