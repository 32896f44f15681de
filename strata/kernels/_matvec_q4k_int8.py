"""Q4_K (planar layout) matvec on int8 activations: four products per instruction with dp4a.

The fp32 kernels spend several instructions per weight (unpack, convert, multiply-add) and Nsight
Compute shows them compute- and L1-bound at a fifth of HBM bandwidth. Here x is first quantized per
32-element sub-block to int8 with one fp32 scale (`_int8_x`), as llama.cpp's CUDA backend does (its
q8_1), and a word of eight nibbles meets its x with two masks and two dp4a (integer dot products of
four bytes). x is packed to match the planar weights: nibble i of weight word r is element 4i + r, so
word w & 0x0F0F0F0F holds elements r, 8 + r, 16 + r, 24 + r and (w >> 4) & 0x0F0F0F0F holds 4 + r,
12 + r, 20 + r, 28 + r; the x words are (lo r = 0..3, hi r = 0..3), eight per sub-block. The min term
takes the exact fp32 sum of x (not sum(q) * dx).

The result differs from the fp32 product by at most sum_k |w_k| * dx_k / 2 (each q is x / dx
rounded to nearest) plus fp32 rounding: comparable to rounding x to bf16 first.
"""

import triton
import triton.language as tl

from strata.kernels._bits import add_to_row3, exact_float, split_range, store_rows
from strata.kernels._int8_x import _dp4a
from strata.kernels._matvec_q4k_planar import _loads
from strata.kernels.kv_in_matvec import kv_prologue, kv_tile_rows
from strata.kernels.pdl import await_inputs


@triton.jit
def q4_k_int8_matvec_kernel(
    xq_ptr, xd_ptr, xs_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, qs_ptr, sc_ptr, mn_ptr, dm_ptr,
    N, K,
    stride_ys, stride_ym, stride_qs, stride_sc, stride_mn, stride_dm,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, USE_ASM: tl.constexpr, ROWS_AT_ONCE: tl.constexpr,
    FLAT_ACC: tl.constexpr = False,
    SCALAR_SCALES: tl.constexpr = False,
    PREFETCH: tl.constexpr = False,
    PAIRED_DM: tl.constexpr = False,
    PDL: tl.constexpr = False, ROWS: tl.constexpr = 0,
    PRELOAD: tl.constexpr = False,
    kv_pos_ptr=None, kv_slot_ptr=None, kv_freq_ptr=None, k_cache_ptr=None, v_cache_ptr=None, rope_scale=1.0,
    stride_cache=0, KV_Q: tl.constexpr = 0, KV_K: tl.constexpr = 0, HEAD_DIM: tl.constexpr = 0,
    INTERLEAVED: tl.constexpr = False,
):  # fmt: skip
    """FLAT_ACC (M = 1): a (BLOCK_N, NS) accumulator in the layout of the step's products, where the
    (1, BLOCK_N, NS) one is converted (through shared memory) on every step; the same sums.
    SCALAR_SCALES: the scales loaded in the words' thread layout (`_loads`' SCALAR); the same sums.
    PREFETCH: each step's weight loads go out before the step before it computes (two steps of
    weights in flight per thread instead of one; Triton pipelines no load of a loop without a dot):
    the same sums. PAIRED_DM: d and dmin from one 32-bit load (`_loads`); the same sums. ROWS: the
    planes in quant_pack's "rows" layout (`_loads`). PRELOAD: PREFETCH's loop, its first step's
    weights loaded before `await_inputs` (weights are never written by a kernel): the same sums.
    The kv_* arguments to INTERLEAVED: the K/V write in the store (as `_matvec_legacy`'s Q8_0)."""
    NS: tl.constexpr = BLOCK_K // 32
    rows = kv_tile_rows(tl.program_id(0), BLOCK_N, KV_Q + KV_K, HEAD_DIM, INTERLEAVED)
    rc = tl.minimum(rows, N - 1)
    kv = (kv_pos_ptr, kv_slot_ptr, kv_freq_ptr, k_cache_ptr, v_cache_ptr, rope_scale, stride_cache)
    if HEAD_DIM > 0:  # (a constant's branch: kv's pointers are None without the K/V write)
        kv = kv_prologue(rows, *kv, M, M_PAD, HEAD_DIM, INTERLEAVED, KV_Q + KV_K > 0)
    js = tl.arange(0, NS)
    n_sub = K // 32
    lo, hi = split_range(n_sub, NS, SPLIT_K)
    strides = (stride_qs, stride_sc, stride_mn, stride_dm)
    if not PRELOAD:
        await_inputs(PDL)
    if PREFETCH or PRELOAD:  # the first step's weights
        s = lo + js
        words, sc, mn, d, dmin = _loads(
            qs_ptr, sc_ptr, mn_ptr, dm_ptr, rc, s, s < hi, *strides, SCALAR_SCALES, PAIRED_DM, ROWS
        )
    if PRELOAD:  # the wait after the first step's weight loads went out
        await_inputs(PDL)
    acc = tl.zeros((BLOCK_N, NS), tl.float32) if FLAT_ACC else tl.zeros((M_PAD, BLOCK_N, NS), tl.float32)
    x = (xq_ptr, xd_ptr, xs_ptr, n_sub)
    if PREFETCH or PRELOAD:
        for s0 in range(lo, hi, NS):
            s = s0 + js
            sn = s + NS  # the next step's loads (masked off past the end)
            w_n, sc_n, mn_n, d_n, dmin_n = _loads(
                qs_ptr, sc_ptr, mn_ptr, dm_ptr, rc, sn, sn < hi, *strides, SCALAR_SCALES, PAIRED_DM, ROWS
            )
            acc = _step(acc, x, s, s < hi, words, sc, mn, d, dmin, M, M_PAD, USE_ASM, FLAT_ACC,
                        ROWS_AT_ONCE)  # fmt: skip
            words, sc, mn, d, dmin = w_n, sc_n, mn_n, d_n, dmin_n
    else:
        for s0 in range(lo, hi, NS):
            s = s0 + js
            sv = s < hi
            words, sc, mn, d, dmin = _loads(
                qs_ptr,
                sc_ptr,
                mn_ptr,
                dm_ptr,
                rc,
                s,
                sv,
                *strides,
                SCALAR=SCALAR_SCALES,
                PAIRED_DM=PAIRED_DM,
                ROWS=ROWS,
            )  # words (BLOCK_N, NS, 4)
            acc = _step(acc, x, s, sv, words, sc, mn, d, dmin, M, M_PAD, USE_ASM, FLAT_ACC,
                        ROWS_AT_ONCE)  # fmt: skip
    acc = tl.sum(acc, 1)[None, :] if FLAT_ACC else tl.sum(acc, 2)
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym, M, M_PAD, b_ptr, HAS_BIAS,
               SPLIT_K, kv, KV_Q, KV_K, HEAD_DIM, INTERLEAVED, BLOCK_N)  # fmt: skip


@triton.jit
def _step(acc, x, s, sv, words, sc, mn, d, dmin, M: tl.constexpr, M_PAD: tl.constexpr, USE_ASM: tl.constexpr,
          FLAT_ACC: tl.constexpr, ROWS_AT_ONCE: tl.constexpr):  # fmt: skip
    """acc plus one step's products of the words (BLOCK_N, NS, 4) of sub-blocks s with x, scaled;
    x is (xq_ptr, xd_ptr, xs_ptr, n_sub)."""
    xq_ptr, xd_ptr, xs_ptr, n_sub = x
    w_lo = words & 0x0F0F0F0F
    w_hi = (words >> 4) & 0x0F0F0F0F
    d_sc = d.to(tl.float32) * exact_float(sc.to(tl.int32), 0)
    d_mn = dmin.to(tl.float32) * exact_float(mn.to(tl.int32), 0)
    if FLAT_ACC:
        acc += _row_part(xq_ptr, xd_ptr, xs_ptr, 0, s, sv, n_sub, w_lo, w_hi, d_sc, d_mn, USE_ASM)
    elif ROWS_AT_ONCE:
        acc += _all_rows(xq_ptr, xd_ptr, xs_ptr, s, sv, n_sub, w_lo, w_hi, d_sc, d_mn, M, M_PAD, USE_ASM)
    else:
        acc = _row_by_row(acc, xq_ptr, xd_ptr, xs_ptr, s, sv, n_sub, w_lo, w_hi, d_sc, d_mn, M, M_PAD,
                          USE_ASM)  # fmt: skip
    return acc


@triton.jit
def _row_by_row(acc, xq_ptr, xd_ptr, xs_ptr, s, sv, n_sub, w_lo, w_hi, d_sc, d_mn, M: tl.constexpr,
                M_PAD: tl.constexpr, USE_ASM: tl.constexpr):  # fmt: skip
    """acc (M_PAD, BLOCK_N, NS) += each row's products with the step's words, one row after another
    (each added through a select over the whole accumulator: work grows as M squared)."""
    for m in tl.static_range(M):
        part = _row_part(xq_ptr, xd_ptr, xs_ptr, m, s, sv, n_sub, w_lo, w_hi, d_sc, d_mn, USE_ASM)
        acc = add_to_row3(acc, part, m, M_PAD)
    return acc


@triton.jit
def _row_part(xq_ptr, xd_ptr, xs_ptr, m, s, sv, n_sub, w_lo, w_hi, d_sc, d_mn, USE_ASM: tl.constexpr):
    """Row m's (BLOCK_N, NS) products with the step's words, per sub-block, scaled.

    x's (NS, 4) words are loaded once and broadcast over the rows, which moves them into the words'
    layout through shared memory (with barriers) at tiles where a thread holds several sub-blocks.
    (Loading them in the words' own layout, once for each row a thread holds, took the barriers out
    but ran slower: STRATA_X_PER_ROW, the 7B 0.927x on an H100; removed.)"""
    ir = tl.arange(0, 4)
    xq_at = xq_ptr + m * n_sub * 8 + s[:, None] * 8 + ir[None, :]
    x_lo = tl.broadcast_to(tl.load(xq_at, mask=sv[:, None], other=0)[None, :, :], w_lo.shape)  # (NS, 4)
    x_hi = tl.broadcast_to(tl.load(xq_at + 4, mask=sv[:, None], other=0)[None, :, :], w_lo.shape)
    dot = _dp4a(w_lo, x_lo, tl.zeros(w_lo.shape, tl.int32), USE_ASM)
    dot = _dp4a(w_hi, x_hi, dot, USE_ASM)
    xd = tl.load(xd_ptr + m * n_sub + s, mask=sv, other=0)
    xs = tl.load(xs_ptr + m * n_sub + s, mask=sv, other=0)
    return d_sc * (tl.sum(dot, 2).to(tl.float32) * xd[None, :]) - d_mn * xs[None, :]


@triton.jit
def _all_rows(xq_ptr, xd_ptr, xs_ptr, s, sv, n_sub, w_lo, w_hi, d_sc, d_mn, M: tl.constexpr,
              M_PAD: tl.constexpr, USE_ASM: tl.constexpr):  # fmt: skip
    """The step's (M_PAD, BLOCK_N, NS) partial sums for every row at once, by broadcasting: the same
    per-row arithmetic as `_row_by_row` (so the same sums, bit for bit), with work linear in M."""
    mi = tl.arange(0, M_PAD)
    valid = (mi < M)[:, None] & sv[None, :]  # (M_PAD, NS)
    xq_at = xq_ptr + mi[:, None, None] * n_sub * 8 + s[None, :, None] * 8
    xq_at += tl.arange(0, 4)[None, None, :]
    # Broadcast by tl.broadcast: a shape tuple built from .shape here reaches the compiler as tensors.
    w_lo4, x_lo = tl.broadcast(
        w_lo[None, :, :, :], tl.load(xq_at, mask=valid[:, :, None], other=0)[:, None, :, :]
    )
    w_hi4, x_hi = tl.broadcast(
        w_hi[None, :, :, :], tl.load(xq_at + 4, mask=valid[:, :, None], other=0)[:, None, :, :]
    )
    dot = _dp4a(w_lo4, x_lo, tl.zeros_like(w_lo4), USE_ASM)
    dot = _dp4a(w_hi4, x_hi, dot, USE_ASM)
    xd = tl.load(xd_ptr + mi[:, None] * n_sub + s[None, :], mask=valid, other=0)
    xs = tl.load(xs_ptr + mi[:, None] * n_sub + s[None, :], mask=valid, other=0)
    dots = tl.sum(dot, 3).to(tl.float32)
    return d_sc[None, :, :] * (dots * xd[:, None, :]) - d_mn[None, :, :] * xs[:, None, :]
