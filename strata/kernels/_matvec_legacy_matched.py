"""One row of x (M = 1) through the fp32 Q8_0 and Q5_0 matvecs with every load in one thread layout.

The kernels of `_matvec_legacy` load a block's quant bytes 16 to a thread while bf16 x loads 8 to a
thread, and reduce each block across threads before scaling it by d: compiled for sm_90 that is
12-14 barriers (shared-memory layout conversions) in every step of the loop. Here a block is four
chunks of eight elements, (BLOCK_N, NB, 4, 8): the chunk index goes through a select that hides its
contiguity from Triton, so the quants load 8 bytes to a thread, as x does (x's pointer has the same
four-dimensional shape, zero along the rows), and d loads once per chunk in the layout of the chunk
sums. Nothing is converted inside the loop. A chunk's eight products are summed, scaled by d and
added to a (BLOCK_N, NB, 4) accumulator that is reduced once after the loop: the same products as
the other kernels, summed in another order (fp32 rounding apart, the same results).
"""

import triton
import triton.language as tl

from strata.kernels._bits import exact_float


@triton.jit
def _chunk_offsets(blk, bm, FIRST: tl.constexpr):
    """(NB, 4, 8) element offsets blk * 32 + FIRST + 8 c + e of chunks c of the blocks blk (FIRST
    picks Q5_0's half), the chunk index passed through a select so that only the 8 elements of a
    chunk count as contiguous."""
    chunk = tl.where(bm[:, None], tl.arange(0, 4)[None, :], 0)  # (NB, 4)
    return blk[:, None, None] * 32 + FIRST + chunk[:, :, None] * 8 + tl.arange(0, 8)[None, None, :]


@triton.jit
def _per_chunk(plane_ptr, rows, stride, blk, bm):
    """(BLOCK_N, NB, 4): each block's entry of a per-block plane (d, Q5_0's qh), once for each of its
    chunks: the layout of the chunk sums, with no conversion."""
    blk = tl.where(bm, blk, 0)  # not contiguous either: one entry a thread, as the chunk sums
    at = plane_ptr + rows[:, None, None] * stride + blk[None, :, None] + tl.zeros((1, 1, 4), tl.int32)
    return tl.load(at, mask=bm[None, :, None], other=0)


@triton.jit
def q8_0_chunks(x_ptr, qs_ptr, d_ptr, rows, lo, hi, stride_qs, stride_d,
                BLOCK_N: tl.constexpr, NB: tl.constexpr):  # fmt: skip
    """Row tile `rows` (clamped to valid rows) times x over blocks [lo, hi): (BLOCK_N,) fp32."""
    acc = tl.zeros((BLOCK_N, NB, 4), tl.float32)
    none = tl.zeros((BLOCK_N, 1, 1, 1), tl.int32)
    for b0 in range(lo, hi, NB):
        blk = b0 + tl.arange(0, NB)
        bm = blk < hi
        off = _chunk_offsets(blk, bm, 0)[None, :, :, :]
        m4 = bm[None, :, None, None]
        q = tl.load(qs_ptr + rows[:, None, None, None] * stride_qs + off, mask=m4, other=0)
        x = tl.load(x_ptr + off + none, mask=m4, other=0).to(tl.float32)
        # q + 128 = the byte with its sign bit flipped.
        w = exact_float(q.to(tl.int32) ^ 0x80, 128)
        acc += tl.sum(w * x, 3) * _per_chunk(d_ptr, rows, stride_d, blk, bm).to(tl.float32)
    return tl.sum(tl.sum(acc, 2), 1)


@triton.jit
def q5_0_chunks(x_ptr, qs_ptr, qh_ptr, d_ptr, rows, lo, hi, stride_qs, stride_qh, stride_d,
                BLOCK_N: tl.constexpr, NB: tl.constexpr):  # fmt: skip
    """As `q8_0_chunks` for Q5_0: byte i of a block holds element i (low nibble) and 16 + i (high);
    bit i of qh is element i's fifth bit. A thread takes two chunks of bytes, eight apiece, and the
    16 elements they hold (chunks 0-1 of the block's low half, 2-3 its high half)."""
    acc = tl.zeros((BLOCK_N, NB, 4), tl.float32)
    none = tl.zeros((BLOCK_N, 1, 1, 1), tl.int32)
    for b0 in range(lo, hi, NB):
        blk = b0 + tl.arange(0, NB)
        bm = blk < hi
        m4 = bm[None, :, None, None]
        el = _chunk_offsets(blk, bm, 0)[None, :, :, :]  # elements 32 blk + 0..31, chunk by chunk
        i = el % 32  # element within the block
        byte = blk[None, :, None, None] * 16 + i % 16
        q = tl.load(qs_ptr + rows[:, None, None, None] * stride_qs + byte, mask=m4, other=0).to(tl.int32)
        qh = _per_chunk(qh_ptr, rows, stride_qh, blk, bm)[:, :, :, None]
        nibble = tl.where(i < 16, q & 15, q >> 4)
        w = exact_float(nibble | (((qh >> i) & 1) << 4), 16)
        x = tl.load(x_ptr + el + none, mask=m4, other=0).to(tl.float32)
        acc += tl.sum(w * x, 3) * _per_chunk(d_ptr, rows, stride_d, blk, bm).to(tl.float32)
    return tl.sum(tl.sum(acc, 2), 1)
