"""Q8_0 and Q5_0 matvecs on int8 activations (dp4a), the 32-element-block counterparts of
`_matvec_q6k_int8` (same x quantization, in element order: word j of a block holds elements 4j..4j+3).

Q8_0: a block's 32 int8 weights are eight words that meet x's eight in signed dp4a as they are.
Q5_0: elements i and 16 + i are the low and high nibbles of quant byte i, and bit i of the block's
uint32 qh is bit 4 of element i. Word j (j < 4: low nibbles of quant word j; j >= 4: high nibbles of
word j - 4) gets its four fifth bits by spreading 4 bits of qh, one to each byte (a multiply by
0x00204081 puts bit b at bit 8b: its four shifted copies do not overlap); then q - 16 per byte without
borrows, as ((q | 0x80) - 16) ^ 0x80. Per block: y += d * dx * dot. The result differs from the fp32
product by at most sum_k |w_k| * dx_k / 2, plus fp32 rounding.
"""

import triton
import triton.language as tl

from strata.kernels._bits import split_range, store_rows
from strata.kernels._int8_x import _dot_rows, _x_rows
from strata.kernels.pdl import await_inputs

# The GGML ids of the two types, for the kernel's constexpr branch.
Q5_0: tl.constexpr = tl.constexpr(6)
Q8_0: tl.constexpr = tl.constexpr(8)


@triton.jit
def _q5_0_words(qs_ptr, qh_ptr, rc, blk, valid, stride_qs, stride_qh):
    """(BLOCK_N, NB, 8) words of q - 16 as signed bytes, in element order."""
    j = tl.arange(0, 8)[None, None, :]
    # Word j's nibbles: quant word j % 4, low for j < 4, high for j >= 4 (a repeated word is a cache hit).
    qs = tl.load(qs_ptr + rc * stride_qs + blk * 4 + j % 4, mask=valid, other=0)
    nib = (qs >> (4 * (j // 4))) & 0x0F0F0F0F
    qh = tl.load(qh_ptr + rc * stride_qh + blk, mask=valid, other=0)  # (BLOCK_N, NB, 1)
    fifth = ((((qh >> (4 * j)) & 15) * 0x00204081) & 0x01010101) << 4
    w = (((nib | fifth).to(tl.uint32, bitcast=True) | 0x80808080) - 0x10101010) ^ 0x80808080
    return w.to(tl.int32, bitcast=True)


@triton.jit
def legacy_int8_matvec_kernel(
    xq_ptr, xd_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, qs_ptr, qh_ptr, d_ptr,
    N, K,
    stride_ys, stride_ym, stride_qs, stride_qh, stride_d,
    QTYPE: tl.constexpr, M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, USE_ASM: tl.constexpr,
    ADD: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """qs_ptr is an int32 view of the quants (stride in words); qh_ptr Q5_0's int32 qh (Q8_0: unused).
    Every row of x at once (M_PAD of them)."""
    NB: tl.constexpr = BLOCK_K // 32
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rc1 = tl.minimum(rows, N - 1)
    rc = rc1[:, None, None]
    j = tl.arange(0, 8)[None, None, :]
    n_blocks = K // 32
    lo, hi = split_range(n_blocks, NB, SPLIT_K)
    await_inputs(PDL)
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
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym,
               M, M_PAD, b_ptr, HAS_BIAS, SPLIT_K, ADD)  # fmt: skip
