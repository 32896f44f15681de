"""Up to four rows of int8 x through the dp4a Q8_0 and Q5_0 matvec, a whole block a lane.

`_matvec_legacy_int8_matched` splits a block into two chunks of four words, (BLOCK_N, NB, 2, 4): a
thread takes one chunk, and Triton spreads the tile so that at 8 rows x 1,024 with 8 warps a thread
holds one chunk of two rows, whose loads of x, dx, Q5_0's quant words and qh are each made twice (both
chunks read the block's quant words; both rows the same x), whose two row sums go through five
shuffles each and then across two warps through shared memory (three barriers). Counted in sm_90 SASS,
251 instructions a thread for its 32 weights: about half in address arithmetic, the duplicated loads
and the reductions. Here a block's halves are two tensors of one shape, (BLOCK_N, NB, 4), so one lane
holds both: it loads the block's quant words, qh and d once, its x in two 16-byte loads, sums the
block's 32 products in two chained dp4a of each word pair (exact integers), and scales the block once.
At NB = 32 (K up to 1,024) a warp is a row: its sum is five shuffles, with no shared memory. The
products are `_matvec_legacy_int8`'s (each block's dp4a sum times d times dx), added in another order
(fp32 rounding apart, the same results). Rows of x beyond one (batched decode, up to 4) each have an
accumulator of their own in the same layout (`int8_blocks`), where the plain loop at 3 rows has 18-20
barriers a step in its sm_90 build.
"""

import triton
import triton.language as tl

from strata.kernels._bits import exact_float
from strata.kernels._int8_x import _dp4a
from strata.kernels._matvec_legacy_int8_matched import _SUM_BIAS, Q8_0, q5_0_signed_words


@triton.jit
def _per_block(plane_ptr, rows, stride, blk, bm):
    """(BLOCK_N, NB): each block's entry of a per-block plane (d, qh, dx with stride 0), its index
    through a select that hides the contiguity: one load a lane, in the layout of the block sums."""
    blk = tl.where(bm, blk, 0)
    return tl.load(plane_ptr + rows[:, None] * stride + blk[None, :], mask=bm[None, :], other=0)


@triton.jit
def int8_block_weights(qs_ptr, qh_ptr, d_ptr, rows, b0, hi, stride_qs, stride_qh, stride_d,
                       QTYPE: tl.constexpr, NB: tl.constexpr):  # fmt: skip
    """Blocks [b0, b0 + NB) below hi of row tile `rows`: the signed weight words of elements 0-15 and
    16-31, (BLOCK_N, NB, 4) each, and d, (BLOCK_N, NB) fp32. qs_ptr is an int32 view of the quants
    (stride in words); qh_ptr Q5_0's int32 qh."""
    blk = b0 + tl.arange(0, NB)
    bm = blk < hi
    e = tl.arange(0, 4)[None, None, :]
    m3 = bm[None, :, None]
    r = rows[:, None, None]
    if QTYPE == Q8_0:  # a block's eight words are its 32 int8 weights as they are
        at = qs_ptr + r * stride_qs + blk[None, :, None] * 8 + e
        low = tl.load(at, mask=m3, other=0)
        high = tl.load(at + 4, mask=m3, other=0)
    else:  # the block's four quant words: elements 0-15 in their low nibbles, 16-31 in the high ones
        qs = tl.load(qs_ptr + r * stride_qs + blk[None, :, None] * 4 + e, mask=m3, other=0)
        qh = _per_block(qh_ptr, rows, stride_qh, blk, bm)[:, :, None]
        low = q5_0_signed_words(qs & 0x0F0F0F0F, qh, e)
        high = q5_0_signed_words((qs >> 4) & 0x0F0F0F0F, qh, 4 + e)
    return low, high, _per_block(d_ptr, rows, stride_d, blk, bm).to(tl.float32)


@triton.jit
def _products(xq_ptr, xd_ptr, m, n_blocks, low, high, d, blk, bm, BLOCK_N: tl.constexpr,
              USE_ASM: tl.constexpr):  # fmt: skip
    """(BLOCK_N, NB): each block's dp4a sum of row m of x's words (rows n_blocks blocks apart) and
    `int8_block_weights`' words, times d and dx."""
    xq_row, xd_row = xq_ptr + m * n_blocks * 8, xd_ptr + m * n_blocks
    m3 = bm[None, :, None]
    # x's pointer in the weights' shape (zero along the rows): its words land in the lanes of theirs.
    e = tl.arange(0, 4)[None, None, :]
    at = xq_row + blk[None, :, None] * 8 + e + tl.zeros((BLOCK_N, 1, 1), tl.int32)
    x_low = tl.load(at, mask=m3, other=0)
    x_high = tl.load(at + 4, mask=m3, other=0)
    words = _dp4a(high, x_high, _dp4a(low, x_low, tl.zeros_like(low), USE_ASM, True), USE_ASM, True)
    dots = tl.sum(words, 2)  # exact, in the lane
    dx = _per_block(xd_row, tl.zeros((BLOCK_N,), tl.int32), 0, blk, bm)
    return d * exact_float(dots + _SUM_BIAS, _SUM_BIAS) * dx


@triton.jit
def int8_block_dot(acc, xq_ptr, xd_ptr, low, high, d, b0, hi, BLOCK_N: tl.constexpr, NB: tl.constexpr,
                   USE_ASM: tl.constexpr):  # fmt: skip
    """acc plus each block's dp4a sum of x's words and `int8_block_weights`' words, times d and dx (x's
    scale for the block, `quantize_x`'s element order): one row of x."""
    blk = b0 + tl.arange(0, NB)
    return acc + _products(xq_ptr, xd_ptr, 0, 0, low, high, d, blk, blk < hi, BLOCK_N, USE_ASM)


@triton.jit
def int8_blocks(xq_ptr, xd_ptr, qs_ptr, qh_ptr, d_ptr, rows, lo, hi, n_blocks, stride_qs, stride_qh, stride_d,
                QTYPE: tl.constexpr, M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                NB: tl.constexpr, USE_ASM: tl.constexpr):  # fmt: skip
    """Row tile `rows` (clamped to valid rows) times M rows of int8 x (up to 4; rows n_blocks blocks
    apart) over blocks [lo, hi): (M_PAD, BLOCK_N) fp32. Each row of x has an accumulator of its own in
    the weights' layout, its x loaded in that layout too (an L1 hit after the first row's tile): no
    layout conversion in the loop for any M, where the plain loop's (M_PAD, BLOCK_N, NB, 8) products
    take several."""
    tl.static_assert(M <= 4, "a whole block a lane takes up to 4 rows of x")
    acc0 = tl.zeros((BLOCK_N, NB), tl.float32)
    acc1 = tl.zeros((BLOCK_N, NB), tl.float32)
    acc2 = tl.zeros((BLOCK_N, NB), tl.float32)
    acc3 = tl.zeros((BLOCK_N, NB), tl.float32)
    for b0 in range(lo, hi, NB):
        low, high, d = int8_block_weights(
            qs_ptr, qh_ptr, d_ptr, rows, b0, hi, stride_qs, stride_qh, stride_d, QTYPE, NB
        )
        blk = b0 + tl.arange(0, NB)
        bm = blk < hi
        x = (xq_ptr, xd_ptr)
        acc0 += _products(*x, 0, n_blocks, low, high, d, blk, bm, BLOCK_N, USE_ASM)
        if M > 1:
            acc1 += _products(*x, 1, n_blocks, low, high, d, blk, bm, BLOCK_N, USE_ASM)
        if M > 2:
            acc2 += _products(*x, 2, n_blocks, low, high, d, blk, bm, BLOCK_N, USE_ASM)
        if M > 3:
            acc3 += _products(*x, 3, n_blocks, low, high, d, blk, bm, BLOCK_N, USE_ASM)
    mi = tl.arange(0, M_PAD)[:, None]
    out = tl.where(mi == 0, tl.sum(acc0, 1)[None, :], 0.0)
    out = tl.where(mi == 1, tl.sum(acc1, 1)[None, :], out)
    out = tl.where(mi == 2, tl.sum(acc2, 1)[None, :], out)
    return tl.where(mi == 3, tl.sum(acc3, 1)[None, :], out)
