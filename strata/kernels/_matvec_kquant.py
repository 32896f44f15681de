"""Fused dequant + matvec kernels for the 256-element k-quant types Q4_K and Q6_K.

Same structure as `_matvec_legacy`: BLOCK_N rows per program, a 1/SPLIT_K share of K, quants turned
into exact float32 integers and dotted with x per sub-block, and the sub-block's float32 scale
(fp16 super-block scale times the integer sub-block scale, as gguf rounds it) applied to that sum.
Q4_K reads the raw GGUF blocks; Q6_K reads the `quant_pack` planes (ql, qh, scales, d).
Q4_K's planar layout has its own kernel, in `_matvec_q4k_planar`.
"""

import triton
import triton.language as tl

from strata.kernels._bits import add_to_row, exact_float, row_at, split_range, store_rows
from strata.kernels.pdl import await_inputs
from strata.kernels.x_loads import load_x


@triton.jit
def _q4_k_scale_min(w_ptr, hdr, j):
    """6-bit (scale, min) of sub-block j (0..7) from the 12 bytes at hdr + 4 (gguf's get_scale_min)."""
    lo = j < 4
    a = tl.load(w_ptr + hdr + j).to(tl.int32)  # byte j of the block: high bits for j >= 4
    b = tl.load(w_ptr + hdr + 4 + j).to(tl.int32)
    c = tl.load(w_ptr + hdr + 8 + j).to(tl.int32)
    sc = tl.where(lo, b & 63, (c & 15) | ((a >> 6) << 4))
    mn = tl.where(lo, c & 63, (c >> 4) | ((b >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def q4_k_matvec_kernel(
    x_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, w_ptr, w16_ptr,
    N, K,
    stride_xm, stride_ys, stride_ym, stride_w,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    await_inputs(PDL)
    # A 144-byte block: d fp16, dmin fp16, 12 scale bytes, then 4 chunks of 32 quant bytes; chunk c
    # holds elements 64c + i (low nibbles, sub-block 2c) and 64c + 32 + i (high nibbles, 2c + 1).
    NC: tl.constexpr = BLOCK_K // 64
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rc = tl.minimum(rows, N - 1)
    ic = tl.arange(0, NC)
    ij = tl.arange(0, 32)
    lo, hi = split_range(K // 64, NC, SPLIT_K)
    acc = tl.zeros((M_PAD, BLOCK_N), tl.float32)
    for c0 in range(lo, hi, NC):
        ch = c0 + ic  # (NC,) chunk index along the row
        cv = ch < hi
        cm = cv[None, :]
        hdr = rc[:, None] * stride_w + (ch // 4)[None, :] * 144  # (BLOCK_N, NC) block start
        hdr = tl.where(cm, hdr, 0)
        # Every term is a multiple of 16 bytes, so each thread's quants come in 16-byte loads.
        q = tl.load(w_ptr + hdr[:, :, None] + 16 + (ch % 4)[None, :, None] * 32 + ij[None, None, :]).to(
            tl.int32
        )
        d = tl.load(w16_ptr + hdr // 2).to(tl.float32)
        dmin = tl.load(w16_ptr + hdr // 2 + 1).to(tl.float32)
        j = (ch % 4)[None, :] * 2
        sc_lo, mn_lo = _q4_k_scale_min(w_ptr, hdr, j)
        sc_hi, mn_hi = _q4_k_scale_min(w_ptr, hdr, j + 1)
        d_lo = tl.where(cm, d * sc_lo, 0.0)
        d_hi = tl.where(cm, d * sc_hi, 0.0)
        m_lo = tl.where(cm, dmin * mn_lo, 0.0)
        m_hi = tl.where(cm, dmin * mn_hi, 0.0)
        w_lo = exact_float(q & 15, 0)
        w_hi = exact_float(q >> 4, 0)
        for m in tl.static_range(M):
            x_at = x_ptr + m * stride_xm + ch[:, None] * 64 + ij[None, :]
            x_lo = tl.load(x_at, mask=cv[:, None], other=0).to(tl.float32)
            x_hi = tl.load(x_at + 32, mask=cv[:, None], other=0).to(tl.float32)
            # sum_i (d*sc*q_i - dmin*mn) x_i = d*sc * sum(q x) - dmin*mn * sum(x)
            part = (
                d_lo * tl.sum(w_lo * x_lo[None, :, :], 2)
                - m_lo * tl.sum(x_lo, 1)[None, :]
                + d_hi * tl.sum(w_hi * x_hi[None, :, :], 2)
                - m_hi * tl.sum(x_hi, 1)[None, :]
            )
            acc = add_to_row(acc, tl.sum(part, 1), m, M_PAD)
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym,
               M, M_PAD, b_ptr, HAS_BIAS, SPLIT_K)  # fmt: skip


@triton.jit
def q6_k_matvec_kernel(
    x_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, ql_ptr, qh_ptr, sc_ptr, d_ptr,
    N, K,
    stride_xm, stride_ys, stride_ym, stride_ql, stride_qh, stride_sc, stride_d,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    up_ptr=None, GATED: tl.constexpr = False,
    PDL: tl.constexpr = False, ROWS: tl.constexpr = 0,
):  # fmt: skip
    """x as `x_loads.load_x` loads it: with GATED silu(x) * up, up laid out like x. ROWS: the planes
    are quant_pack's Q6_K "rows" layout with ROWS rows a group (the strides a group's), read through
    `row_at`."""
    await_inputs(PDL)
    # Work goes in halves of a super-block (128 elements): half g has ql bytes 64g..64g+63, qh bytes
    # 32g..32g+31 and scales 8g..8g+7. Element 128g + 32s + i (s = 0..3, i = 0..31) takes its low
    # 4 bits from ql byte 64g + 32(s % 2) + i (low nibble for s < 2) and its high 2 bits from bits
    # 2s, 2s+1 of qh byte 32g + i; q = that 6-bit value - 32, scaled by d * scales[8g + 2s + i // 16].
    NH: tl.constexpr = BLOCK_K // 128
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rc = tl.minimum(rows, N - 1)
    ih = tl.arange(0, NH)
    ij = tl.arange(0, 32)
    it = tl.arange(0, 2)
    lo, hi = split_range(K // 128, NH, SPLIT_K)
    acc = tl.zeros((M_PAD, BLOCK_N), tl.float32)
    for g0 in range(lo, hi, NH):
        g = g0 + ih  # (NH,)
        gm = g < hi
        m3 = gm[None, :, None]
        r3 = rc[:, None, None]
        col = g[None, :, None] * 64 + ij[None, None, :]
        ql_a = tl.load(ql_ptr + row_at(r3, col, stride_ql, ROWS, 16, 16), mask=m3, other=0).to(tl.int32)
        ql_b = tl.load(ql_ptr + row_at(r3, col + 32, stride_ql, ROWS, 16, 16), mask=m3, other=0).to(tl.int32)
        qh_at = qh_ptr + row_at(r3, g[None, :, None] * 32 + ij[None, None, :], stride_qh, ROWS, 16, 16)
        qh = tl.load(qh_at, mask=m3, other=0).to(tl.int32)  # (BLOCK_N, NH, 32), like ql's
        d_at = d_ptr + row_at(rc[:, None], (g // 2)[None, :], stride_d, ROWS, 1, 1)
        d = tl.load(d_at, mask=gm[None, :], other=0)
        d = d.to(tl.float32)[:, :, None]  # (BLOCK_N, NH, 1)
        for s in tl.static_range(4):
            low = ql_a if s % 2 == 0 else ql_b
            low = low & 15 if s < 2 else low >> 4
            w = exact_float(low | (((qh >> (2 * s)) & 3) << 4), 32)
            w = tl.reshape(w, (BLOCK_N, NH, 2, 16))
            sc_col = g[None, :, None] * 8 + 2 * s + it[None, None, :]
            sc = tl.load(sc_ptr + row_at(r3, sc_col, stride_sc, ROWS, 8, 8), mask=m3, other=0)
            scale = d * sc.to(tl.float32)  # (BLOCK_N, NH, 2)
            x_off = g[:, None, None] * 128 + 32 * s + it[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]
            for m in tl.static_range(M):
                x_at = m * stride_xm + x_off
                xv = load_x(x_ptr, up_ptr, x_at, gm[:, None, None], GATED)
                part = tl.sum(tl.sum(tl.sum(w * xv[None, :, :, :], 3) * scale, 2), 1)
                acc = add_to_row(acc, part, m, M_PAD)
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym,
               M, M_PAD, b_ptr, HAS_BIAS, SPLIT_K)  # fmt: skip
