"""Q8_0 and Q5_0 matvecs on int8 activations (dp4a), the 32-element-block counterparts of
`_matvec_q6k_int8` (same x quantization, in element order: word j of a block holds elements 4j..4j+3).

Q8_0: a block's 32 int8 weights are eight words that meet x's eight in signed dp4a as they are.
Q5_0: elements i and 16 + i are the low and high nibbles of quant byte i, and bit i of the block's
uint32 qh is bit 4 of element i. Word j (j < 4: low nibbles of quant word j; j >= 4: high nibbles of
word j - 4) gets its four fifth bits by spreading 4 bits of qh, one to each byte (a multiply by
0x00204081 puts bit b at bit 8b: its four shifted copies do not overlap); then q - 16 per byte without
borrows: the nibble where the bit is set, 0xF0 | nibble where it is clear (`q5_0_signed_words`). Per
block: y += d * dx * dot. The result differs from the fp32 product by at most sum_k |w_k| * dx_k / 2,
plus fp32 rounding.
"""

import triton
import triton.language as tl

from strata.kernels._bits import split_range, store_rows
from strata.kernels._int8_x import _dot_rows, _x_rows
from strata.kernels._matvec_legacy_int8_blocks import int8_block_dot, int8_block_weights, int8_blocks
from strata.kernels._matvec_legacy_int8_matched import (
    Q8_0,
    int8_chunk_dot,
    int8_chunk_weights,
    int8_chunks,
    q5_0_signed_words,
)
from strata.kernels.kv_in_matvec import kv_prologue, kv_tile_rows
from strata.kernels.pdl import await_inputs, await_inputs_after


@triton.jit
def _q5_0_words(qs_ptr, qh_ptr, rc, blk, valid, stride_qs, stride_qh):
    """(BLOCK_N, NB, 8) words of q - 16 as signed bytes, in element order."""
    j = tl.arange(0, 8)[None, None, :]
    # Word j's nibbles: quant word j % 4, low for j < 4, high for j >= 4 (a repeated word is a cache hit).
    qs = tl.load(qs_ptr + rc * stride_qs + blk * 4 + j % 4, mask=valid, other=0)
    nib = (qs >> (4 * (j // 4))) & 0x0F0F0F0F
    qh = tl.load(qh_ptr + rc * stride_qh + blk, mask=valid, other=0)  # (BLOCK_N, NB, 1)
    return q5_0_signed_words(nib, qh, j)


@triton.jit
def legacy_int8_matvec_kernel(
    xq_ptr, xd_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, qs_ptr, qh_ptr, d_ptr,
    N, K,
    stride_ys, stride_ym, stride_qs, stride_qh, stride_d,
    QTYPE: tl.constexpr, M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, USE_ASM: tl.constexpr,
    PDL: tl.constexpr = False, MATCHED: tl.constexpr = False,
    PRELOAD: tl.constexpr = False, LANE_BLOCKS: tl.constexpr = False,
    kv_pos_ptr=None, kv_slot_ptr=None, kv_freq_ptr=None, k_cache_ptr=None, v_cache_ptr=None, rope_scale=1.0,
    stride_cache=0, KV_Q: tl.constexpr = 0, KV_K: tl.constexpr = 0, HEAD_DIM: tl.constexpr = 0,
    INTERLEAVED: tl.constexpr = False,
):  # fmt: skip
    """qs_ptr is an int32 view of the quants (stride in words); qh_ptr Q5_0's int32 qh (Q8_0: unused).
    Every row of x at once (M_PAD of them). MATCHED (M = 1): `_matvec_legacy_int8_matched`'s loop, every
    load in one thread layout; with PRELOAD (one step a program), its step's weights loaded and decoded
    before the PDL wait. LANE_BLOCKS: `_matvec_legacy_int8_blocks`' layout (a block a lane), the loop
    for up to 4 rows of x, or with PRELOAD the one step for one. The kv_* arguments to INTERLEAVED: the
    K/V write in the store (as `_matvec_legacy`'s Q8_0)."""
    NB: tl.constexpr = BLOCK_K // 32
    rows = kv_tile_rows(tl.program_id(0), BLOCK_N, KV_Q + KV_K, HEAD_DIM, INTERLEAVED)
    rc1 = tl.minimum(rows, N - 1)
    n_blocks = K // 32
    kv = (kv_pos_ptr, kv_slot_ptr, kv_freq_ptr, k_cache_ptr, v_cache_ptr, rope_scale, stride_cache)
    if HEAD_DIM > 0:  # (a constant's branch: kv's pointers are None without the K/V write)
        kv = kv_prologue(rows, *kv, M, M_PAD, HEAD_DIM, INTERLEAVED, KV_Q + KV_K > 0)
    lo, hi = split_range(n_blocks, NB, SPLIT_K)
    tl.static_assert(not PRELOAD or MATCHED or LANE_BLOCKS, "PRELOAD runs the matched or the lanes' step")
    if PRELOAD and LANE_BLOCKS:  # the decode before the wait, as below
        low, high, d = int8_block_weights(
            qs_ptr, qh_ptr, d_ptr, rc1, lo, hi, stride_qs, stride_qh, stride_d, QTYPE, NB
        )
        await_inputs_after((tl.sum(low ^ high, 2).to(tl.float32) * d).to(tl.int32, bitcast=True), PDL)
        acc = tl.zeros((BLOCK_N, NB), tl.float32)
        acc = int8_block_dot(acc, xq_ptr, xd_ptr, low, high, d, lo, hi, BLOCK_N, NB, USE_ASM)
        acc = tl.sum(acc, 1)[None, :]
    elif PRELOAD:  # the decode before the wait (`await_inputs_after`): a float token of every word
        w, d = int8_chunk_weights(
            qs_ptr, qh_ptr, d_ptr, rc1, lo, hi, stride_qs, stride_qh, stride_d, QTYPE, NB
        )
        await_inputs_after((tl.sum(w, 3).to(tl.float32) * d).to(tl.int32, bitcast=True), PDL)
        acc = tl.zeros((BLOCK_N, NB, 2), tl.float32)
        acc = int8_chunk_dot(acc, xq_ptr, xd_ptr, w, d, lo, hi, BLOCK_N, NB, USE_ASM)
        acc = tl.sum(tl.sum(acc, 2), 1)[None, :]
    elif LANE_BLOCKS:
        await_inputs(PDL)
        acc = int8_blocks(xq_ptr, xd_ptr, qs_ptr, qh_ptr, d_ptr, rc1, lo, hi, n_blocks, stride_qs, stride_qh,
                          stride_d, QTYPE, M, M_PAD, BLOCK_N, NB, USE_ASM)  # fmt: skip
    elif MATCHED:
        await_inputs(PDL)
        acc = int8_chunks(xq_ptr, xd_ptr, qs_ptr, qh_ptr, d_ptr, rc1, lo, hi, stride_qs, stride_qh, stride_d,
                          QTYPE, BLOCK_N, NB, USE_ASM)[None, :]  # fmt: skip
    else:
        await_inputs(PDL)
        acc = _rows(xq_ptr, xd_ptr, qs_ptr, qh_ptr, d_ptr, rc1, lo, hi, n_blocks, stride_qs, stride_qh,
                    stride_d, QTYPE, M, M_PAD, BLOCK_N, NB, USE_ASM)  # fmt: skip
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym, M, M_PAD, b_ptr, HAS_BIAS,
               SPLIT_K, kv, KV_Q, KV_K, HEAD_DIM, INTERLEAVED, BLOCK_N)  # fmt: skip


@triton.jit
def _rows(xq_ptr, xd_ptr, qs_ptr, qh_ptr, d_ptr, rc1, lo, hi, n_blocks, stride_qs, stride_qh, stride_d,
          QTYPE: tl.constexpr, M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, NB: tl.constexpr,
          USE_ASM: tl.constexpr):  # fmt: skip
    """Every row of x times row tile rc1 over blocks [lo, hi): (M_PAD, BLOCK_N) fp32."""
    rc = rc1[:, None, None]
    j = tl.arange(0, 8)[None, None, :]
    acc = tl.zeros((M_PAD, BLOCK_N), tl.float32)
    for b0 in range(lo, hi, NB):
        blk1 = b0 + tl.arange(0, NB)
        bv = blk1 < hi
        blk = blk1[None, :, None]
        valid = bv[None, :, None]
        if QTYPE == Q8_0:
            w = tl.load(qs_ptr + rc * stride_qs + blk * 8 + j, mask=valid, other=0)  # (BLOCK_N, NB, 8)
        else:
            w = _q5_0_words(qs_ptr, qh_ptr, rc, blk, valid, stride_qs, stride_qh)
        x, dx = _x_rows(xq_ptr, xd_ptr, blk1, bv, n_blocks, M, M_PAD)
        dot = tl.sum(_dot_rows(w, x, USE_ASM), 3).to(tl.float32)  # (M_PAD, BLOCK_N, NB)
        d = tl.load(d_ptr + rc1[:, None] * stride_d + blk1[None, :], mask=bv[None, :], other=0).to(tl.float32)
        part = d[None, :, :] * dot * dx[:, None, :]
        acc += tl.sum(part, 2)
    return acc
