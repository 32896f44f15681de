"""Fused dequant + matvec kernels for the 32-element block types Q8_0, Q5_0 and Q4_0.

Each reads the planes of `quant_pack` (quants, then high bits, then fp16 scales), y[m, n] =
sum_k x[m, k] * w[n, k], a program owning BLOCK_N output rows of every activation row and a
1/SPLIT_K share of K. The quants are turned into exact float32 integers and dotted with x per block;
the block's scale multiplies that block sum (d * sum(q * x) rather than sum((d * q) * x): the same
weights, a different rounding order, within fp32 tolerance of the reference).
"""

import triton
import triton.language as tl

from strata.kernels._bits import add_to_row, exact_float, split_range, store_rows
from strata.kernels._matvec_legacy_matched import (
    q5_0_chunk_dot,
    q5_0_chunk_weights,
    q5_0_chunks,
    q8_0_chunk_dot,
    q8_0_chunk_weights,
    q8_0_chunks,
)
from strata.kernels.kv_in_matvec import kv_prologue, kv_tile_rows
from strata.kernels.pdl import await_inputs, await_inputs_after, prefetch_weights


@triton.jit
def q8_0_matvec_kernel(
    x_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, qs_ptr, d_ptr,
    N, K,
    stride_xm, stride_ys, stride_ym, stride_qs, stride_d,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, MATCHED: tl.constexpr = False,
    PDL: tl.constexpr = False, PRELOAD: tl.constexpr = False,
    kv_pos_ptr=None, kv_slot_ptr=None, kv_freq_ptr=None, k_cache_ptr=None, v_cache_ptr=None, rope_scale=1.0,
    stride_cache=0, KV_Q: tl.constexpr = 0, KV_K: tl.constexpr = 0, HEAD_DIM: tl.constexpr = 0,
    INTERLEAVED: tl.constexpr = False,
):  # fmt: skip
    """MATCHED (M = 1): `_matvec_legacy_matched`'s loop, every load in one thread layout.
    PRELOAD (M = 1, one step a program): the step's weights loaded and decoded before `await_inputs`,
    then the loop's one step on them (the same operations, so the same bits); with MATCHED, the
    matched loop's one step (no layout conversion of x after the wait).
    The kv_* arguments to INTERLEAVED: `kv_in_matvec`'s rotary embedding and K/V-cache write in the
    store (HEAD_DIM > 0; the tile's rows from `kv_tile_rows`)."""
    NB: tl.constexpr = BLOCK_K // 32
    rows = kv_tile_rows(tl.program_id(0), BLOCK_N, KV_Q + KV_K, HEAD_DIM, INTERLEAVED)
    # Clamped rows load valid bytes; only the store is masked, so the loads need no row mask.
    rc = tl.minimum(rows, N - 1)
    kv = (kv_pos_ptr, kv_slot_ptr, kv_freq_ptr, k_cache_ptr, v_cache_ptr, rope_scale, stride_cache)
    if HEAD_DIM > 0:  # (a constant's branch: kv's pointers are None without the K/V write)
        kv = kv_prologue(rows, *kv, M, M_PAD, HEAD_DIM, INTERLEAVED, KV_Q + KV_K > 0)
    lo, hi = split_range(K // 32, NB, SPLIT_K)
    if PRELOAD and MATCHED:
        w, d = q8_0_chunk_weights(qs_ptr, d_ptr, rc, lo, hi, stride_qs, stride_d, NB)
    elif PRELOAD:
        w, d = _q8_0_weights(qs_ptr, d_ptr, rc, lo, hi, stride_qs, stride_d, NB)
    else:
        prefetch_weights(qs_ptr, rc, stride_qs, lo * 32, hi * 32, BLOCK_K, PDL)
    if PRELOAD:  # the decode before the wait (`await_inputs_after`): a token of every weight
        await_inputs_after((tl.sum(w, len(w.shape) - 1) * d).to(tl.int32, bitcast=True), PDL)
    else:
        await_inputs(PDL)
    if PRELOAD and MATCHED:
        acc = q8_0_chunk_dot(tl.zeros((BLOCK_N, NB, 4), tl.float32), x_ptr, w, d, lo, hi, BLOCK_N, NB)
        acc = tl.sum(tl.sum(acc, 2), 1)[None, :]
    elif PRELOAD:
        acc = _q8_0_dot(tl.zeros((M_PAD, BLOCK_N), tl.float32), x_ptr, w, d, lo, hi, 0, stride_xm, M_PAD, NB)
    elif MATCHED:
        acc = q8_0_chunks(x_ptr, qs_ptr, d_ptr, rc, lo, hi, stride_qs, stride_d, BLOCK_N, NB)[None, :]
    else:
        acc = _q8_0_rows(x_ptr, qs_ptr, d_ptr, rc, lo, hi, stride_xm, stride_qs, stride_d,
                         M, M_PAD, BLOCK_N, NB)  # fmt: skip
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym, M, M_PAD, b_ptr, HAS_BIAS,
               SPLIT_K, kv, KV_Q, KV_K, HEAD_DIM, INTERLEAVED, BLOCK_N)  # fmt: skip


@triton.jit
def q5_0_matvec_kernel(
    x_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, qs_ptr, qh_ptr, d_ptr,
    N, K,
    stride_xm, stride_ys, stride_ym, stride_qs, stride_qh, stride_d,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, FLAT_ACC: tl.constexpr = False,
    MATCHED: tl.constexpr = False,
    PDL: tl.constexpr = False, PRELOAD: tl.constexpr = False,
    kv_pos_ptr=None, kv_slot_ptr=None, kv_freq_ptr=None, k_cache_ptr=None, v_cache_ptr=None, rope_scale=1.0,
    stride_cache=0, KV_Q: tl.constexpr = 0, KV_K: tl.constexpr = 0, HEAD_DIM: tl.constexpr = 0,
    INTERLEAVED: tl.constexpr = False,
):  # fmt: skip
    """FLAT_ACC (M = 1): the products are added to a (BLOCK_N, NB, 16) accumulator and summed once
    after the loop, instead of three reductions (one across threads) every step. MATCHED (M = 1):
    `_matvec_legacy_matched`'s loop, every load in one thread layout. PRELOAD and the K/V write: as
    Q8_0's."""
    NB: tl.constexpr = BLOCK_K // 32
    rows = kv_tile_rows(tl.program_id(0), BLOCK_N, KV_Q + KV_K, HEAD_DIM, INTERLEAVED)
    rc = tl.minimum(rows, N - 1)
    kv = (kv_pos_ptr, kv_slot_ptr, kv_freq_ptr, k_cache_ptr, v_cache_ptr, rope_scale, stride_cache)
    if HEAD_DIM > 0:  # (a constant's branch: kv's pointers are None without the K/V write)
        kv = kv_prologue(rows, *kv, M, M_PAD, HEAD_DIM, INTERLEAVED, KV_Q + KV_K > 0)
    lo, hi = split_range(K // 32, NB, SPLIT_K)
    if PRELOAD and MATCHED:
        w_lo, w_hi, d = q5_0_chunk_weights(qs_ptr, qh_ptr, d_ptr, rc, lo, hi, stride_qs, stride_qh,
                                           stride_d, NB)  # fmt: skip
    elif PRELOAD:
        w_lo, w_hi, d = _q5_0_weights(qs_ptr, qh_ptr, d_ptr, rc, lo, hi, stride_qs, stride_qh, stride_d, NB)
    else:
        prefetch_weights(qs_ptr, rc, stride_qs, lo * 16, hi * 16, BLOCK_K // 2, PDL)
    if PRELOAD:  # as Q8_0's
        await_inputs_after((tl.sum(w_lo + w_hi, len(w_lo.shape) - 1) * d).to(tl.int32, bitcast=True), PDL)
    else:
        await_inputs(PDL)
    if PRELOAD and MATCHED:
        acc = q5_0_chunk_dot(tl.zeros((BLOCK_N, NB, 2), tl.float32), x_ptr, w_lo, w_hi, d, lo, hi,
                             BLOCK_N, NB)  # fmt: skip
        acc = tl.sum(tl.sum(acc, 2), 1)[None, :]
    elif PRELOAD:
        acc = _q5_0_dot(tl.zeros((M_PAD, BLOCK_N), tl.float32), x_ptr, w_lo, w_hi, d, lo, hi, 0,
                        stride_xm, M_PAD, NB, False)  # fmt: skip
    elif MATCHED:
        acc = q5_0_chunks(x_ptr, qs_ptr, qh_ptr, d_ptr, rc, lo, hi, stride_qs, stride_qh, stride_d,
                          BLOCK_N, NB)[None, :]  # fmt: skip
    else:
        acc = _q5_0_rows(x_ptr, qs_ptr, qh_ptr, d_ptr, rc, lo, hi, stride_xm, stride_qs, stride_qh, stride_d,
                         M, M_PAD, BLOCK_N, NB, FLAT_ACC)  # fmt: skip
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym, M, M_PAD, b_ptr, HAS_BIAS,
               SPLIT_K, kv, KV_Q, KV_K, HEAD_DIM, INTERLEAVED, BLOCK_N)  # fmt: skip


@triton.jit
def _q8_0_rows(x_ptr, qs_ptr, d_ptr, rc, lo, hi, stride_xm, stride_qs, stride_d,
               M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, NB: tl.constexpr):  # fmt: skip
    """Every row of x times row tile rc over blocks [lo, hi): (M_PAD, BLOCK_N) fp32, each block's
    sum scaled by its d. BLOCK_N is passed, not read from rc.shape (see `_int8_x.store_int8`)."""
    acc = tl.zeros((M_PAD, BLOCK_N), tl.float32)
    for b0 in range(lo, hi, NB):
        w, d = _q8_0_weights(qs_ptr, d_ptr, rc, b0, hi, stride_qs, stride_d, NB)
        for m in tl.static_range(M):
            acc = _q8_0_dot(acc, x_ptr, w, d, b0, hi, m, stride_xm, M_PAD, NB)
    return acc


@triton.jit
def _q8_0_weights(qs_ptr, d_ptr, rc, b0, hi, stride_qs, stride_d, NB: tl.constexpr):
    """Row tile rc's blocks [b0, b0 + NB) below hi: (BLOCK_N, NB, 32) exact fp32 quants, (BLOCK_N, NB)
    fp32 scales."""
    blk = b0 + tl.arange(0, NB)
    bm = blk < hi
    ij = tl.arange(0, 32)
    q = tl.load(
        qs_ptr + rc[:, None, None] * stride_qs + blk[None, :, None] * 32 + ij[None, None, :],
        mask=bm[None, :, None],
        other=0,
    )  # (BLOCK_N, NB, 32) uint8 holding int8
    # q + 128 = the byte with its sign bit flipped.
    w = exact_float(q.to(tl.int32) ^ 0x80, 128)
    d = tl.load(d_ptr + rc[:, None] * stride_d + blk[None, :], mask=bm[None, :], other=0)
    return w, d.to(tl.float32)


@triton.jit
def _q8_0_dot(acc, x_ptr, w, d, b0, hi, m, stride_xm, M_PAD: tl.constexpr, NB: tl.constexpr):
    """acc with x's row m times the decoded blocks [b0, b0 + NB) (`_q8_0_weights`) added to its row m."""
    blk = b0 + tl.arange(0, NB)
    bm = blk < hi
    ij = tl.arange(0, 32)
    xv = tl.load(x_ptr + m * stride_xm + blk[:, None] * 32 + ij[None, :], mask=bm[:, None], other=0)
    xv = xv.to(tl.float32)
    part = tl.sum(tl.sum(w * xv[None, :, :], 2) * d, 1)
    return add_to_row(acc, part, m, M_PAD)


@triton.jit
def _q5_0_rows(x_ptr, qs_ptr, qh_ptr, d_ptr, rc, lo, hi, stride_xm, stride_qs, stride_qh, stride_d,
               M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, NB: tl.constexpr,
               FLAT_ACC: tl.constexpr):  # fmt: skip
    """As `_q8_0_rows` for Q5_0; FLAT_ACC: see the kernel."""
    acc = tl.zeros((BLOCK_N, NB, 16), tl.float32) if FLAT_ACC else tl.zeros((M_PAD, BLOCK_N), tl.float32)
    for b0 in range(lo, hi, NB):
        w_lo, w_hi, d = _q5_0_weights(qs_ptr, qh_ptr, d_ptr, rc, b0, hi, stride_qs, stride_qh, stride_d, NB)
        for m in tl.static_range(M):
            acc = _q5_0_dot(acc, x_ptr, w_lo, w_hi, d, b0, hi, m, stride_xm, M_PAD, NB, FLAT_ACC)
    if FLAT_ACC:
        acc = tl.sum(tl.sum(acc, 2), 1)[None, :]
    return acc


@triton.jit
def _q5_0_weights(qs_ptr, qh_ptr, d_ptr, rc, b0, hi, stride_qs, stride_qh, stride_d, NB: tl.constexpr):
    """Row tile rc's blocks [b0, b0 + NB) below hi: the (BLOCK_N, NB, 16) exact fp32 quants of each
    block's first and second 16 elements, and the (BLOCK_N, NB) fp32 scales."""
    blk = b0 + tl.arange(0, NB)
    bm = blk < hi
    ij = tl.arange(0, 16)
    # Byte i of a block holds element i in its low nibble and element 16 + i in its high one.
    q = tl.load(
        qs_ptr + rc[:, None, None] * stride_qs + blk[None, :, None] * 16 + ij[None, None, :],
        mask=bm[None, :, None],
        other=0,
    ).to(tl.int32)  # (BLOCK_N, NB, 16)
    qh = tl.load(qh_ptr + rc[:, None] * stride_qh + blk[None, :], mask=bm[None, :], other=0)
    qh = qh[:, :, None]
    w_lo = exact_float((q & 15) | (((qh >> ij[None, None, :]) & 1) << 4), 16)
    w_hi = exact_float((q >> 4) | (((qh >> (ij[None, None, :] + 16)) & 1) << 4), 16)
    d = tl.load(d_ptr + rc[:, None] * stride_d + blk[None, :], mask=bm[None, :], other=0)
    return w_lo, w_hi, d.to(tl.float32)


@triton.jit
def _q5_0_dot(acc, x_ptr, w_lo, w_hi, d, b0, hi, m, stride_xm, M_PAD: tl.constexpr, NB: tl.constexpr,
              FLAT_ACC: tl.constexpr):  # fmt: skip
    """As `_q8_0_dot` for Q5_0's decoded halves (`_q5_0_weights`); FLAT_ACC: acc is the kernel's flat
    (BLOCK_N, NB, 16) accumulator."""
    blk = b0 + tl.arange(0, NB)
    bm = blk < hi
    ij = tl.arange(0, 16)
    x_at = x_ptr + m * stride_xm + blk[:, None] * 32 + ij[None, :]
    x_lo = tl.load(x_at, mask=bm[:, None], other=0).to(tl.float32)[None, :, :]
    x_hi = tl.load(x_at + 16, mask=bm[:, None], other=0).to(tl.float32)[None, :, :]
    if FLAT_ACC:
        out = acc + (w_lo * x_lo + w_hi * x_hi) * d[:, :, None]
    else:
        part = tl.sum((tl.sum(w_lo * x_lo, 2) + tl.sum(w_hi * x_hi, 2)) * d, 1)
        out = add_to_row(acc, part, m, M_PAD)
    return out


@triton.jit
def q4_0_matvec_kernel(
    x_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, qs_ptr, d_ptr,
    N, K,
    stride_xm, stride_ys, stride_ym, stride_qs, stride_d,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    await_inputs(PDL)
    NB: tl.constexpr = BLOCK_K // 32
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rc = tl.minimum(rows, N - 1)
    ib = tl.arange(0, NB)
    ij = tl.arange(0, 16)
    lo, hi = split_range(K // 32, NB, SPLIT_K)
    acc = tl.zeros((M_PAD, BLOCK_N), tl.float32)
    for b0 in range(lo, hi, NB):
        blk = b0 + ib
        bm = blk < hi
        q = tl.load(
            qs_ptr + rc[:, None, None] * stride_qs + blk[None, :, None] * 16 + ij[None, None, :],
            mask=bm[None, :, None],
            other=0,
        ).to(tl.int32)  # (BLOCK_N, NB, 16)
        w_lo = exact_float(q & 15, 8)
        w_hi = exact_float(q >> 4, 8)
        d = tl.load(d_ptr + rc[:, None] * stride_d + blk[None, :], mask=bm[None, :], other=0).to(tl.float32)
        for m in tl.static_range(M):
            x_at = x_ptr + m * stride_xm + blk[:, None] * 32 + ij[None, :]
            x_lo = tl.load(x_at, mask=bm[:, None], other=0).to(tl.float32)[None, :, :]
            x_hi = tl.load(x_at + 16, mask=bm[:, None], other=0).to(tl.float32)[None, :, :]
            part = tl.sum((tl.sum(w_lo * x_lo, 2) + tl.sum(w_hi * x_hi, 2)) * d, 1)
            acc = add_to_row(acc, part, m, M_PAD)
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym,
               M, M_PAD, b_ptr, HAS_BIAS, SPLIT_K)  # fmt: skip
