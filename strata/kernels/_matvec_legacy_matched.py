"""One row of x (M = 1) through the fp32 Q8_0 and Q5_0 matvecs with every load in one thread layout.

The kernels of `_matvec_legacy` load a block's quant bytes 16 to a thread while bf16 x loads 8 to a
thread, and reduce each block across threads before scaling it by d: compiled for sm_90 that is
12-14 barriers (shared-memory layout conversions) in every step of the loop. Here a block's quant
bytes are chunks of eight, (BLOCK_N, NB, chunks, 8) (Q8_0 four, Q5_0 two, each byte holding two
elements): the chunk index goes through a select that hides its contiguity from Triton, so the quants
load 8 bytes to a thread, as x does (x's pointer has the same four-dimensional shape, zero along the
rows), and d loads once per chunk in the layout of the chunk sums. Nothing is converted inside the
loop (compile_check: 0 barriers). A chunk's products are summed, scaled by d and added to a
(BLOCK_N, NB, chunks) accumulator reduced once after the loop: the same products as the other
kernels, summed in another order (fp32 rounding apart, the same results).
"""

import triton
import triton.language as tl

from strata.kernels._bits import exact_float


@triton.jit
def _in_block(bm, CHUNKS: tl.constexpr):
    """(NB, CHUNKS, 8) offsets 8 c + e within a block, the chunk index c passed through a select so
    that only the 8 elements of a chunk count as contiguous (one 8-element load a thread)."""
    chunk = tl.where(bm[:, None], tl.arange(0, CHUNKS)[None, :], 0)
    return chunk[:, :, None] * 8 + tl.arange(0, 8)[None, None, :]


@triton.jit
def _per_chunk(plane_ptr, rows, stride, blk, bm, CHUNKS: tl.constexpr):
    """(BLOCK_N, NB, CHUNKS): each block's entry of a per-block plane (d, Q5_0's qh), once for each
    of its chunks, its block index also through a select: the layout of the chunk sums, no conversion."""
    blk = tl.where(bm, blk, 0)
    at = plane_ptr + rows[:, None, None] * stride + blk[None, :, None] + tl.zeros((1, 1, CHUNKS), tl.int32)
    return tl.load(at, mask=bm[None, :, None], other=0)


@triton.jit
def q8_0_chunks(x_ptr, qs_ptr, d_ptr, rows, lo, hi, stride_qs, stride_d,
                BLOCK_N: tl.constexpr, NB: tl.constexpr):  # fmt: skip
    """Row tile `rows` (clamped to valid rows) times x over blocks [lo, hi): (BLOCK_N,) fp32. A block's
    32 quant bytes are four chunks of 8, a thread's chunk meeting its 8 elements of x."""
    acc = tl.zeros((BLOCK_N, NB, 4), tl.float32)
    for b0 in range(lo, hi, NB):
        w, d = q8_0_chunk_weights(qs_ptr, d_ptr, rows, b0, hi, stride_qs, stride_d, NB)
        acc = q8_0_chunk_dot(acc, x_ptr, w, d, b0, hi, BLOCK_N, NB)
    return tl.sum(tl.sum(acc, 2), 1)


@triton.jit
def q8_0_chunk_weights(qs_ptr, d_ptr, rows, b0, hi, stride_qs, stride_d, NB: tl.constexpr):
    """Blocks [b0, b0 + NB) below hi of row tile `rows`: (BLOCK_N, NB, 4, 8) exact fp32 quants in
    chunks of 8 and (BLOCK_N, NB, 4) fp32 scales, each block's once per chunk (the sums' layout)."""
    blk = b0 + tl.arange(0, NB)
    bm = blk < hi
    off = (blk[:, None, None] * 32 + _in_block(bm, 4))[None, :, :, :]
    q = tl.load(qs_ptr + rows[:, None, None, None] * stride_qs + off, mask=bm[None, :, None, None], other=0)
    # q + 128 = the byte with its sign bit flipped.
    w = exact_float(q.to(tl.int32) ^ 0x80, 128)
    return w, _per_chunk(d_ptr, rows, stride_d, blk, bm, 4).to(tl.float32)


@triton.jit
def q8_0_chunk_dot(acc, x_ptr, w, d, b0, hi, BLOCK_N: tl.constexpr, NB: tl.constexpr):
    """acc plus the chunk sums of x times the blocks [b0, b0 + NB) decoded by `q8_0_chunk_weights`."""
    blk = b0 + tl.arange(0, NB)
    bm = blk < hi
    off = (blk[:, None, None] * 32 + _in_block(bm, 4))[None, :, :, :] + tl.zeros((BLOCK_N, 1, 1, 1), tl.int32)
    x = tl.load(x_ptr + off, mask=bm[None, :, None, None], other=0).to(tl.float32)
    return acc + tl.sum(w * x, 3) * d


@triton.jit
def q5_0_chunks(x_ptr, qs_ptr, qh_ptr, d_ptr, rows, lo, hi, stride_qs, stride_qh, stride_d,
                BLOCK_N: tl.constexpr, NB: tl.constexpr):  # fmt: skip
    """As `q8_0_chunks` for Q5_0: byte i of a block holds element i (low nibble) and 16 + i (high);
    bit i of qh is element i's fifth bit. A block's 16 quant bytes are two chunks of 8; a thread's
    chunk meets its 8 elements of each half of x."""
    acc = tl.zeros((BLOCK_N, NB, 2), tl.float32)
    for b0 in range(lo, hi, NB):
        w_lo, w_hi, d = q5_0_chunk_weights(qs_ptr, qh_ptr, d_ptr, rows, b0, hi, stride_qs, stride_qh,
                                           stride_d, NB)  # fmt: skip
        acc = q5_0_chunk_dot(acc, x_ptr, w_lo, w_hi, d, b0, hi, BLOCK_N, NB)
    return tl.sum(tl.sum(acc, 2), 1)


@triton.jit
def q5_0_chunk_weights(qs_ptr, qh_ptr, d_ptr, rows, b0, hi, stride_qs, stride_qh, stride_d,
                       NB: tl.constexpr):  # fmt: skip
    """Blocks [b0, b0 + NB) below hi of row tile `rows`: the (BLOCK_N, NB, 2, 8) exact fp32 quants of
    each block's first and second 16 elements in chunks of 8, and (BLOCK_N, NB, 2) fp32 scales."""
    blk = b0 + tl.arange(0, NB)
    bm = blk < hi
    m4 = bm[None, :, None, None]
    i = _in_block(bm, 2)[None, :, :, :]  # bytes 0..15 of the block
    q_at = qs_ptr + rows[:, None, None, None] * stride_qs + blk[None, :, None, None] * 16 + i
    q = tl.load(q_at, mask=m4, other=0).to(tl.int32)
    qh = _per_chunk(qh_ptr, rows, stride_qh, blk, bm, 2)[:, :, :, None]
    w_lo = exact_float((q & 15) | (((qh >> i) & 1) << 4), 16)
    w_hi = exact_float((q >> 4) | (((qh >> (i + 16)) & 1) << 4), 16)
    return w_lo, w_hi, _per_chunk(d_ptr, rows, stride_d, blk, bm, 2).to(tl.float32)


@triton.jit
def q5_0_chunk_dot(acc, x_ptr, w_lo, w_hi, d, b0, hi, BLOCK_N: tl.constexpr, NB: tl.constexpr):
    """acc plus the chunk sums of x times the halves decoded by `q5_0_chunk_weights`."""
    blk = b0 + tl.arange(0, NB)
    bm = blk < hi
    m4 = bm[None, :, None, None]
    x_at = (
        blk[None, :, None, None] * 32
        + _in_block(bm, 2)[None, :, :, :]
        + tl.zeros((BLOCK_N, 1, 1, 1), tl.int32)
    )
    x_lo = tl.load(x_ptr + x_at, mask=m4, other=0).to(tl.float32)
    x_hi = tl.load(x_ptr + x_at + 16, mask=m4, other=0).to(tl.float32)
    return acc + tl.sum(w_lo * x_lo + w_hi * x_hi, 3) * d
