"""One row of int8 x (M = 1) through the dp4a Q8_0 and Q5_0 matvec with every load in one thread layout.

`_matvec_legacy_int8`'s loop loads a block's eight weight words, x's words and the scales each in a
layout of its own and sums each block's dp4a products across threads before scaling it: compiled for
sm_90 that is 5-6 layout conversions and 14-16 barriers in every step (`compile_check`). Here, as
`_matvec_legacy_matched` does for 16-bit x, a block is two chunks of four words, (BLOCK_N, NB, 2, 4):
the chunk index goes through a select that hides its contiguity from Triton, so a thread loads a
chunk's four weight words (Q5_0: the block's four quant words, whose low or high nibbles the chunk
takes) and x's four in one 16-byte load each, x's pointer having the weights' shape (zero along the
rows), and d and dx load once per chunk in the layout of the chunk sums. A chunk's 16 products are
summed in the thread (exact integers), scaled by d and dx and added to a (BLOCK_N, NB, 2) accumulator
reduced once after the loop: the products of `_matvec_legacy_int8`, each block's two chunk sums scaled
apart instead of their sum (fp32 rounding apart, the same results).
"""

import triton
import triton.language as tl

from strata.kernels._bits import exact_float
from strata.kernels._int8_x import _dp4a

# The GGML id of Q8_0, for the kernels' constexpr branch (any other is Q5_0, id 6).
Q8_0: tl.constexpr = tl.constexpr(8)

# |a chunk's sum| <= 16 * 128 * 127 < 2**20: the sum plus this is a non-negative integer below 2**23.
_SUM_BIAS: tl.constexpr = tl.constexpr(1 << 20)


@triton.jit
def q5_0_signed_words(nib, qh, j):
    """Weight words of q - 16 as signed bytes: `nib` the words' four nibbles (one a byte), `qh` the
    block's fifth bits, `j` the word's index in the block (bits 4j .. 4j + 3 of qh are its bytes').
    A multiply by 0x00204081 puts bit b of the four at bit 8b (its shifted copies do not overlap).
    A byte whose fifth bit is set is its nibble (16 + nib - 16); one whose bit is clear is nib - 16,
    which in two's complement is 0xF0 | nib: so the cleared bits, times 0xF0, ORed in (no borrows;
    one instruction fewer a word than ((q | 0x80) - 16) ^ 0x80 in the sm_90 build)."""
    clear = ~(((qh >> (4 * j)) & 15) * 0x00204081) & 0x01010101
    return nib | (clear * 0xF0)


@triton.jit
def _chunk_index(bm):
    """(NB, 2): each block's chunk indices 0 and 1 through a select (only a chunk's four words count
    as contiguous: one 16-byte load a thread)."""
    return tl.where(bm[:, None], tl.arange(0, 2)[None, :], 0)


@triton.jit
def int8_chunk_weights(qs_ptr, qh_ptr, d_ptr, rows, b0, hi, stride_qs, stride_qh, stride_d,
                       QTYPE: tl.constexpr, NB: tl.constexpr):  # fmt: skip
    """Blocks [b0, b0 + NB) below hi of row tile `rows`: (BLOCK_N, NB, 2, 4) signed weight words in
    element order (chunk c: words 4c .. 4c + 3) and (BLOCK_N, NB, 2) fp32 scales, each block's once
    per chunk. qs_ptr is an int32 view of the quants (stride in words); qh_ptr Q5_0's int32 qh."""
    blk = b0 + tl.arange(0, NB)
    bm = blk < hi
    c = _chunk_index(bm)[None, :, :, None]
    e = tl.arange(0, 4)[None, None, None, :]
    m4 = bm[None, :, None, None]
    r = rows[:, None, None, None]
    if QTYPE == Q8_0:  # a block's eight words are its 32 int8 weights as they are
        w = tl.load(qs_ptr + r * stride_qs + blk[None, :, None, None] * 8 + c * 4 + e, mask=m4, other=0)
    else:  # both chunks read the block's four quant words: the low nibbles, then the high ones
        qs = tl.load(qs_ptr + r * stride_qs + blk[None, :, None, None] * 4 + c * 0 + e, mask=m4, other=0)
        nib = (qs >> (4 * c)) & 0x0F0F0F0F
        qh = _per_chunk(qh_ptr, rows, stride_qh, blk, bm)[:, :, :, None]
        w = q5_0_signed_words(nib, qh, c * 4 + e)
    return w, _per_chunk(d_ptr, rows, stride_d, blk, bm).to(tl.float32)


@triton.jit
def _per_chunk(plane_ptr, rows, stride, blk, bm):
    """(BLOCK_N, NB, 2): each block's entry of a per-block plane (d, qh) once for each of its chunks,
    its block index through a select: the layout of the chunk sums."""
    blk = tl.where(bm, blk, 0)
    at = plane_ptr + rows[:, None, None] * stride + blk[None, :, None] + tl.zeros((1, 1, 2), tl.int32)
    return tl.load(at, mask=bm[None, :, None], other=0)


@triton.jit
def int8_chunk_dot(acc, xq_ptr, xd_ptr, w, d, b0, hi, BLOCK_N: tl.constexpr, NB: tl.constexpr,
                   USE_ASM: tl.constexpr):  # fmt: skip
    """acc plus each chunk's dp4a sum of x's words and the words of `int8_chunk_weights`, times d and
    dx (x's scale for the block, `quantize_x`'s element order)."""
    blk = b0 + tl.arange(0, NB)
    bm = blk < hi
    c = _chunk_index(bm)[None, :, :, None]
    at = blk[None, :, None, None] * 8 + c * 4 + tl.arange(0, 4)[None, None, None, :]
    x = tl.load(xq_ptr + at + tl.zeros((BLOCK_N, 1, 1, 1), tl.int32), mask=bm[None, :, None, None], other=0)
    dots = tl.sum(_dp4a(w, x, tl.zeros_like(w), USE_ASM, SIGNED_A=True), 3)  # exact, in the thread
    dx_at = tl.where(bm, blk, 0)[None, :, None] + tl.zeros((BLOCK_N, 1, 2), tl.int32)
    dx = tl.load(xd_ptr + dx_at, mask=bm[None, :, None], other=0)
    return acc + d * exact_float(dots + _SUM_BIAS, _SUM_BIAS) * dx


@triton.jit
def int8_chunks(xq_ptr, xd_ptr, qs_ptr, qh_ptr, d_ptr, rows, lo, hi, stride_qs, stride_qh, stride_d,
                QTYPE: tl.constexpr, BLOCK_N: tl.constexpr, NB: tl.constexpr,
                USE_ASM: tl.constexpr):  # fmt: skip
    """Row tile `rows` (clamped to valid rows) times int8 x over blocks [lo, hi): (BLOCK_N,) fp32."""
    acc = tl.zeros((BLOCK_N, NB, 2), tl.float32)
    for b0 in range(lo, hi, NB):
        w, d = int8_chunk_weights(
            qs_ptr, qh_ptr, d_ptr, rows, b0, hi, stride_qs, stride_qh, stride_d, QTYPE, NB
        )
        acc = int8_chunk_dot(acc, xq_ptr, xd_ptr, w, d, b0, hi, BLOCK_N, NB, USE_ASM)
    return tl.sum(tl.sum(acc, 2), 1)
