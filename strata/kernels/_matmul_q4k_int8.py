"""Q4_K (planar layout) matmul on int8 activations: integer tensor-core dots, one per sub-block.

The bf16 matmul decodes every weight to a float on the CUDA cores (about 11 instructions per weight,
half of them the decode) and is bound by that, not by the tensor cores. Here x is quantized per
32-element sub-block to int8 (`_int8_x`, in the planar order the int8 matvec reads) and a
sub-block's nibbles become int8 bytes with one mask (and, for the high nibbles, one shift) per four
weights: word w & 0x0F0F0F0F holds elements r, 8 + r, 16 + r, 24 + r of word r and (w >> 4) &
0x0F0F0F0F holds 4 + r, ... 28 + r, the same bytes as x's words (lo r, hi r). One int8 `tl.dot` per
sub-block (K = 32) gives every (row, output) pair's integer sum, which is scaled into the fp32
accumulator as the int8 matvec scales its dp4a sums: d * sc * (sum * dx) - dmin * mn * (sum of x).
Per sub-block that part is bit for bit the matvec's (`_matvec_q4k_int8._row_part`); the sub-blocks
are added in K order.
"""

import triton
import triton.language as tl

from strata.kernels._bits import exact_float, sum_splits


@triton.jit
def _int8_bytes(words, BLOCK_N: tl.constexpr, USE_ASM: tl.constexpr):
    """(BLOCK_N, 4) planar words -> (BLOCK_N, 32) int8 quants, in x's byte order: word (h, r) = 4h + r
    holds nibbles h, h + 2, h + 4, h + 6 of word r as bytes 0-3."""
    h = tl.arange(0, 2)[None, :, None]
    v = (words[:, None, :] >> (4 * h)) & 0x0F0F0F0F  # (BLOCK_N, 2, 4): word 4h + r
    v4 = tl.broadcast_to(v[:, :, :, None], (BLOCK_N, 2, 4, 4))
    if USE_ASM:
        # Four int8 outputs packed in one register are exactly the word: no per-byte extraction.
        q = tl.inline_asm_elementwise(
            "mov.b32 $0, $1;", "=r,r,r,r,r", [v4], dtype=tl.int8, is_pure=True, pack=4
        )
    else:  # Triton's interpreter runs no PTX: the same bytes, one by one
        q = ((v4 >> (8 * tl.arange(0, 4)[None, None, None, :])) & 255).to(tl.int8)
    return tl.reshape(q, (BLOCK_N, 32))


@triton.jit
def q4_k_int8_matmul_kernel(
    xq_ptr, xd_ptr, xs_ptr, y_ptr, ws_ptr, lock_ptr, qs_ptr, sc_ptr, mn_ptr, dm_ptr,
    M, N, K,
    stride_ym, stride_qs, stride_sc, stride_mn, stride_dm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUBS: tl.constexpr, SPLIT_K: tl.constexpr,
    SWAP_AB: tl.constexpr, USE_ASM: tl.constexpr,
):  # fmt: skip
    """y[m, n] = sum_k x[m, k] w[n, k] for rows of int8 x: xq (M, K) bytes in planar order, its
    scales xd and exact sums xs (M, K / 32). A program owns a (BLOCK_M, BLOCK_N) tile of y (grid:
    M tiles fastest, then N tiles; program_id(1) its share of K under SPLIT_K) and walks K a
    sub-block at a time, SUBS sub-blocks per loop step."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    pid_m = tl.program_id(0) % num_pid_m
    pid_n = tl.program_id(0) // num_pid_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Clamped rows load valid data; only the store is masked.
    mc = tl.minimum(rm, M - 1)
    rc = tl.minimum(rn, N - 1)
    n_sub = K // 32
    per_split = tl.cdiv(tl.cdiv(n_sub, SUBS), SPLIT_K) * SUBS
    s_lo = tl.program_id(1) * per_split
    s_hi = tl.minimum(s_lo + per_split, n_sub)
    e = tl.arange(0, 32)
    ir = tl.arange(0, 4)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for s0 in range(s_lo, s_hi, SUBS):
        for j in tl.static_range(SUBS):
            # Sub-blocks past this split's end repeat its last one with its x sums masked to zero.
            s = tl.minimum(s0 + j, s_hi - 1)
            live = s0 + j < s_hi
            x8 = tl.load(xq_ptr + mc[:, None] * K + s * 32 + e[None, :])  # (BLOCK_M, 32) int8
            words = tl.load(qs_ptr + rc[:, None] * stride_qs + 4 * s + ir[None, :])  # (BLOCK_N, 4)
            w8 = _int8_bytes(words, BLOCK_N, USE_ASM)
            if SWAP_AB:
                dot = tl.trans(tl.dot(w8, tl.trans(x8), out_dtype=tl.int32))
            else:
                dot = tl.dot(x8, tl.trans(w8), out_dtype=tl.int32)
            d_sc = tl.load(dm_ptr + rc * stride_dm + (s // 8) * 2).to(tl.float32) * exact_float(
                tl.load(sc_ptr + rc * stride_sc + s).to(tl.int32), 0
            )
            d_mn = tl.load(dm_ptr + rc * stride_dm + (s // 8) * 2 + 1).to(tl.float32) * exact_float(
                tl.load(mn_ptr + rc * stride_mn + s).to(tl.int32), 0
            )
            xd = tl.where(live, tl.load(xd_ptr + mc * n_sub + s), 0.0)
            xs = tl.where(live, tl.load(xs_ptr + mc * n_sub + s), 0.0)
            acc += d_sc[None, :] * (dot.to(tl.float32) * xd[:, None]) - d_mn[None, :] * xs[:, None]
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    at = rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptr + at, acc.to(y_ptr.dtype.element_ty), mask=inside)
    else:
        at_ws = rm.to(tl.int64)[:, None] * N + rn[None, :]
        sum_splits(ws_ptr, y_ptr, lock_ptr, acc, at_ws, at, inside, tl.program_id(0), M * N, 0.0, SPLIT_K)
