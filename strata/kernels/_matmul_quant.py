"""Fused dequant + tensor-core matmul kernel for the GGUF types of `quant_pack` (prefill, batched decode).

y[m, n] = sum_k x[m, k] * w[n, k]: a program owns a (BLOCK_M, BLOCK_N) tile of y and walks K in
BLOCK_K steps. Each step decodes a (BLOCK_N, BLOCK_K) tile of W from the planes in registers, rounds
it to x's dtype and feeds it to `tl.dot` with fp32 accumulation. The decoded values are the float32
values of `strata.quant.dequantize`, computed in the same order (d * sc, then * q, then - dmin * mn);
the launcher turns off FMA contraction so that the compiler keeps those roundings. Rounding them to
fp16/bf16 before the dot is the intended semantic (dequantize, cast, matmul); fp32 x keeps them fp32.

Every type is decoded in groups of 16 elements (16 consecutive elements share one scale in every
type; in all but the IQ2 types their quants sit in 16 consecutive bytes of one plane, while IQ2_XS and
IQ2_S look up two 8-value grid rows per group), so a tile is viewed as (BLOCK_N, BLOCK_K // 16, 16)
with the group's scale broadcast along the last axis and 16-byte loads where the layout allows.

SWAP_AB computes y^T = W x^T instead: the decoded W tile is then the dot's first operand (the one
Hopper's wgmma may read from registers) and a small M becomes the instruction's narrow N side
(BLOCK_M >= 16 either way, tl.dot's minimum); benchmarks/gpu_matmul.py times both orders.
"""

import triton
import triton.language as tl

from strata.kernels._bits import exact_float, row_at, sum_splits
from strata.kernels._matvec_kquant import _q4_k_scale_min
from strata.kernels._matvec_lowbit import IQ2_XS_SIGNS, grid_value, iq2_scale
from strata.kernels.quant_pack import ROWS

# Static ids of the types (the GGML enum values) so the kernel can branch on a constexpr.
Q4_0: tl.constexpr = tl.constexpr(2)
Q5_0: tl.constexpr = tl.constexpr(6)
Q8_0: tl.constexpr = tl.constexpr(8)
Q4_K: tl.constexpr = tl.constexpr(12)
Q6_K: tl.constexpr = tl.constexpr(14)
Q2_K: tl.constexpr = tl.constexpr(10)
IQ2_XS: tl.constexpr = tl.constexpr(17)
IQ2_S: tl.constexpr = tl.constexpr(22)
IQ4_XS: tl.constexpr = tl.constexpr(23)
# Not a GGML id: Q4_K in quant_pack's planar layout (`kernel_type` picks it).
Q4_K_PLANAR: tl.constexpr = tl.constexpr(112)
# Not a GGML id either: Q4_K in quant_pack's "rows" layout (the planar planes regrouped by ROWS rows).
Q4_K_ROWS: tl.constexpr = tl.constexpr(113)
# And Q6_K in its "rows" layout (its four planes regrouped by ROWS rows).
Q6_K_ROWS: tl.constexpr = tl.constexpr(114)
ROWS_GROUP: tl.constexpr = tl.constexpr(ROWS)


def kernel_type(qtype: int, layout: str) -> int:
    """The QTYPE the kernels branch on for a packed weight of this GGML type and layout."""
    if layout == "rows":
        return Q6_K_ROWS.value if qtype == Q6_K.value else Q4_K_ROWS.value
    return Q4_K_PLANAR.value if layout == "planar" else qtype


@triton.jit
def _group_scales(QTYPE: tl.constexpr, p0_ptr, p1_ptr, p2_ptr, p3_ptr, r3, t3, s0, s1, s2, s3):
    """(mul, sub) of every (row, group), each (BLOCK_N, NT, 1) float32: the group decodes to mul * q - sub
    (sub is only read for Q4_K; the other types return mul twice)."""
    if QTYPE == Q2_K:
        # `_group_quants` decodes Q2_K's whole values (see there); 1 * w is w exactly.
        mul = (t3 * 0 + 1).to(tl.float32)
        sub = mul
    elif QTYPE == IQ4_XS:
        # Sub-block j = (t % 16) // 2 of block t // 16: the low 4 bits of its 6-bit scale are nibble
        # j % 2 of scales_l byte j // 2, the high 2 bits 2j, 2j+1 of scales_h (the block's first two
        # bytes of the 6-byte scale plane p2); d is in p3.
        j = (t3 % 16) // 2
        hdr = r3 * s2 + (t3 // 16) * 6
        sl = tl.load(p2_ptr + hdr + 2 + j // 2).to(tl.int32)
        sh = tl.load(p2_ptr + hdr + j // 4).to(tl.int32)
        scale = ((sl >> (4 * (j % 2))) & 15) | (((sh >> (2 * (j % 4))) & 3) << 4)
        mul = tl.load(p3_ptr + r3 * s3 + t3 // 16).to(tl.float32) * exact_float(scale, 32)
        sub = mul
    elif QTYPE == IQ2_XS:
        # Group t is sub-block t: nibble t % 2 of scale byte t // 2 (p2), d of block t // 16 (p3).
        sc = tl.load(p2_ptr + r3 * s2 + t3 // 2).to(tl.int32)
        mul = iq2_scale(tl.load(p3_ptr + r3 * s3 + t3 // 16).to(tl.float32), (sc >> (4 * (t3 % 2))) & 15)
        sub = mul
    elif QTYPE == IQ2_S:
        # Sub-block u = t % 16 of block t // 16: nibble u % 2 of scale byte 72 + u // 2 of its 80
        # bytes in p0; d in p2.
        sc = tl.load(p0_ptr + r3 * s0 + (t3 // 16) * 80 + 72 + (t3 % 16) // 2).to(tl.int32)
        mul = iq2_scale(tl.load(p2_ptr + r3 * s2 + t3 // 16).to(tl.float32), (sc >> (4 * (t3 % 2))) & 15)
        sub = mul
    elif QTYPE == Q4_K:
        # Super-block t // 16 (144 bytes at hdr: d, dmin, 12 scale bytes); group t is in sub-block
        # j = (t % 16) // 2.
        hdr = r3 * s0 + (t3 // 16) * 144
        sc, mn = _q4_k_scale_min(p0_ptr, hdr, (t3 % 16) // 2)
        mul = tl.load(p1_ptr + hdr // 2).to(tl.float32) * sc
        sub = tl.load(p1_ptr + hdr // 2 + 1).to(tl.float32) * mn
    elif QTYPE == Q4_K_PLANAR or QTYPE == Q4_K_ROWS:  # noqa: SIM109 (constexpr comparisons)
        # Sub-block t // 2's unpacked scale (p1) and min (p2); d, dmin of super-block t // 16 (p3).
        R: tl.constexpr = ROWS_GROUP if QTYPE == Q4_K_ROWS else 0
        b2 = (t3 // 16) * 2
        d = tl.load(p3_ptr + row_at(r3, b2, s3, R, 2, 2)).to(tl.float32)
        dmin = tl.load(p3_ptr + row_at(r3, b2 + 1, s3, R, 2, 2)).to(tl.float32)
        mul = d * exact_float(tl.load(p1_ptr + row_at(r3, t3 // 2, s1, R, 8, 16)).to(tl.int32), 0)
        sub = dmin * exact_float(tl.load(p2_ptr + row_at(r3, t3 // 2, s2, R, 8, 16)).to(tl.int32), 0)
    elif QTYPE == Q6_K or QTYPE == Q6_K_ROWS:  # noqa: SIM109 (constexpr comparisons)
        # The int8 scale of group t times the super-block's d.
        R6: tl.constexpr = ROWS_GROUP if QTYPE == Q6_K_ROWS else 0
        d = tl.load(p3_ptr + row_at(r3, t3 // 16, s3, R6, 1, 1)).to(tl.float32)
        mul = d * tl.load(p2_ptr + row_at(r3, t3, s2, R6, 8, 8)).to(tl.float32)
        sub = mul
    else:
        # The fp16 d of block t // 2 (the last plane: p2 for Q5_0, p1 for Q8_0 and Q4_0).
        if QTYPE == Q5_0:
            mul = tl.load(p2_ptr + r3 * s2 + t3 // 2).to(tl.float32)
        else:
            mul = tl.load(p1_ptr + r3 * s1 + t3 // 2).to(tl.float32)
        sub = mul
    return mul, sub


@triton.jit
def _legacy_nibbles(qs_ptr, r3, t3, i3, s0):
    # Block t // 2 holds element i in byte i's low nibble and 16 + i in its high one.
    q = tl.load(qs_ptr + r3 * s0 + (t3 // 2) * 16 + i3).to(tl.int32)
    return (q >> (4 * (t3 % 2))) & 15


@triton.jit
def _group_quants(QTYPE: tl.constexpr, p0_ptr, p1_ptr, r3, t3, i3, s0, s1):
    """Every (row, group)'s quants as exact float32 integers less the type's offset, (BLOCK_N, NT, 16);
    for the codebook types their signed levels or grid values (p1 is the `codebook` table). Q4_K's
    planar layout has `_planar_quants` instead."""
    if QTYPE == Q2_K:
        # Sub-block u = t % 16 of block t // 16 (80 bytes of p0: 16 scale bytes, 64 quant bytes; d and
        # dmin in p1): elements are bits 2s, 2s+1 of quant bytes 32(u // 8) + 16(u % 2) + i, with
        # s = (u % 8) // 2. Decoded whole, d * sc * q - dmin * mn, so that the callers' mul * q - sub
        # stays Q4_K's alone.
        u = t3 % 16
        blk = r3 * s0 + (t3 // 16) * 80
        q = tl.load(p0_ptr + blk + 16 + (u // 8) * 32 + (u % 2) * 16 + i3).to(tl.int32)
        q = exact_float((q >> (2 * ((u % 8) // 2))) & 3, 0)
        sc = tl.load(p0_ptr + blk + u).to(tl.int32)
        dm = p1_ptr + r3 * s1 + (t3 // 16) * 2
        dl = tl.load(dm).to(tl.float32) * exact_float(sc & 15, 0)
        w = dl * q - tl.load(dm + 1).to(tl.float32) * exact_float(sc >> 4, 0)
    elif QTYPE == IQ4_XS:
        # The 4-bit level indices sit as Q4_0's nibbles do, 16 bytes per 32-element sub-block.
        w = tl.load(p1_ptr + _legacy_nibbles(p0_ptr, r3, t3, i3, s0))
    elif QTYPE == IQ2_XS:
        # Element i of group t is element i % 8 of uint16 quant 2t + i // 8 (int16 plane: drop the sign
        # extension): grid row q & 511, ksigns pattern q >> 9.
        q = tl.load(p0_ptr + r3 * s0 + 2 * t3 + i3 // 8).to(tl.int32) & 0xFFFF
        w = grid_value(p1_ptr, q & 511, tl.load(p1_ptr + IQ2_XS_SIGNS + (q >> 9)).to(tl.int32), i3 % 8)
    elif QTYPE == IQ2_S:
        # Element i of group t is element i % 8 of grid entry e = 2(t % 16) + i // 8 of its block's 80
        # bytes: index qs[e] | (bits 2(e % 4), +1 of qh[e // 4]) << 8, sign bits signs[e].
        blk = p0_ptr + r3 * s0 + (t3 // 16) * 80
        e = 2 * (t3 % 16) + i3 // 8
        qh = tl.load(blk + 64 + e // 4).to(tl.int32)
        index = tl.load(blk + e).to(tl.int32) | (((qh >> (2 * (e % 4))) & 3) << 8)
        w = grid_value(p1_ptr, index, tl.load(blk + 32 + e).to(tl.int32), i3 % 8)
    elif QTYPE == Q8_0:
        # Group t is bytes 16t..16t+15 of the int8 quants; q + 128 = the byte with its sign bit flipped.
        q = tl.load(p0_ptr + r3 * s0 + t3 * 16 + i3)
        w = exact_float(q.to(tl.int32) ^ 0x80, 128)
    elif QTYPE == Q4_0:
        w = exact_float(_legacy_nibbles(p0_ptr, r3, t3, i3, s0), 8)
    elif QTYPE == Q5_0:
        # Bit j of block t // 2's uint32 qh is bit 4 of element j.
        qh = tl.load(p1_ptr + r3 * s1 + t3 // 2)
        q = _legacy_nibbles(p0_ptr, r3, t3, i3, s0) | (((qh >> (16 * (t3 % 2) + i3)) & 1) << 4)
        w = exact_float(q, 16)
    elif QTYPE == Q4_K:
        # Sub-block j = (t % 16) // 2 is the low (j even) or high nibbles of the 32 quant bytes at
        # 16 + 32 * (j // 2) of the super-block.
        j = (t3 % 16) // 2
        byte = (t3 // 16) * 144 + 16 + (j // 2) * 32 + (t3 % 2) * 16
        q = tl.load(p0_ptr + r3 * s0 + byte + i3).to(tl.int32)
        w = exact_float((q >> (4 * (j % 2))) & 15, 0)
    else:
        # Q6_K, half g = t // 8 of a super-block: element 32s + i (s = 0..3) takes its low 4 bits from
        # ql byte 64g + 32(s % 2) + i (low nibble for s < 2) and its high 2 bits from bits 2s, 2s + 1
        # of qh byte 32g + i.
        # (Q6_K_ROWS: the same bytes through `row_at`.)
        R: tl.constexpr = ROWS_GROUP if QTYPE == Q6_K_ROWS else 0
        g = t3 // 8
        s = (t3 % 8) // 2
        i = (t3 % 2) * 16 + i3
        ql = tl.load(p0_ptr + row_at(r3, g * 64 + (s % 2) * 32 + i, s0, R, 16, 16)).to(tl.int32)
        qh = tl.load(p1_ptr + row_at(r3, g * 32 + i, s1, R, 16, 16)).to(tl.int32)
        w = exact_float(((ql >> (4 * (s // 2))) & 15) | (((qh >> (2 * s)) & 3) << 4), 32)
    return w


@triton.jit
def _planar_quants(
    words_ptr,
    rc,
    first_sub,
    last_sub,
    stride_words,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ROWS: tl.constexpr = 0,
):
    """Q4_K planar: the quants of sub-blocks first_sub .. (clamped to last_sub) of rows rc as exact
    float32 integers, (BLOCK_N, BLOCK_K // 16, 16) like `_group_quants`. A sub-block's four words
    are one 16-byte load, and nibble i of word r is element 4i + r: shifting every word by 4i and
    reshaping (i, r) puts the 32 elements in order, with no per-byte gather."""
    NS: tl.constexpr = BLOCK_K // 32
    sub = tl.minimum(first_sub + tl.arange(0, NS), last_sub)
    if ROWS == 0:
        at = words_ptr + rc[:, None, None] * stride_words + 4 * sub[None, :, None]
        at += tl.arange(0, 4)[None, None, :]
    else:  # quant_pack's "rows" layout
        at = words_ptr + row_at(rc[:, None, None], 4 * sub[None, :, None] + tl.arange(0, 4)[None, None, :],
                                stride_words, ROWS, 4, 4)  # fmt: skip
    shift = 4 * tl.arange(0, 8)[None, None, :, None]
    q = exact_float((tl.load(at)[:, :, None, :] >> shift) & 15, 0)  # (BLOCK_N, NS, 8, 4)
    return tl.reshape(q, (BLOCK_N, BLOCK_K // 16, 16))


@triton.jit
def _bf16_in_f32(v):
    """v rounded to the nearest bf16 (ties to even), kept as float32; finite v only."""
    u = v.to(tl.int32, bitcast=True)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & -65536
    return u.to(tl.float32, bitcast=True)


@triton.jit
def quant_matmul_kernel(
    x_ptr, y_ptr, ws_ptr, lock_ptr, p0_ptr, p1_ptr, p2_ptr, p3_ptr,
    M, N, K,
    stride_xm, stride_ym, s0, s1, s2, s3,
    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr, EVEN_K: tl.constexpr, BF16_AS_F32: tl.constexpr,
    PRECISION: tl.constexpr, SPLIT_K: tl.constexpr,
):  # fmt: skip
    # Under SPLIT_K, program_id(1) is this program's share of the K steps; the partial tiles are summed
    # by the last split to finish (`sum_splits`, through the (SPLIT_K, M, N) fp32 workspace ws).
    # Grouped order: GROUP_M row tiles sweep the N tiles together, so their W tiles stay in L2.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Clamped rows load valid data; only the store is masked, so the loads need no row mask.
    x_rows = x_ptr + tl.minimum(rm, M - 1).to(tl.int64)[:, None] * stride_xm
    rc = tl.minimum(rn, N - 1)
    NT: tl.constexpr = BLOCK_K // 16
    last_group = K // 16 - 1
    acc = tl.zeros((BLOCK_N, BLOCK_M) if SWAP_AB else (BLOCK_M, BLOCK_N), tl.float32)
    r3 = rc[:, None, None]
    i3 = tl.arange(0, 16)[None, None, :]
    groups = tl.arange(0, NT)[None, :, None]
    # The scales are 1- and 2-byte loads, which Triton's pipeliner leaves in the loop (cp.async moves
    # 4 bytes or more), so they are loaded one step ahead by hand. (On an H200 this changed little:
    # decoding, not load latency, is what limits the kernel.)
    steps = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    k_lo = tl.program_id(1) * steps * BLOCK_K
    k_hi = tl.minimum(k_lo + steps * BLOCK_K, K)
    t_first = tl.minimum(k_lo // 16 + groups, last_group)
    mul, sub = _group_scales(QTYPE, p0_ptr, p1_ptr, p2_ptr, p3_ptr, r3, t_first, s0, s1, s2, s3)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        t3 = k0 // 16 + groups
        if EVEN_K:
            xt = tl.load(x_rows + kk[None, :])
        else:
            # Groups past K repeat the last one (finite, valid bytes) and meet x = 0.
            xt = tl.load(x_rows + kk[None, :], mask=kk[None, :] < K, other=0)
            t3 = tl.minimum(t3, last_group)
        if QTYPE == Q4_K_PLANAR or QTYPE == Q4_K_ROWS:  # noqa: SIM109 (constexpr comparisons)
            R: tl.constexpr = ROWS_GROUP if QTYPE == Q4_K_ROWS else 0
            q = _planar_quants(p0_ptr, rc, k0 // 32, K // 32 - 1, s0, BLOCK_N, BLOCK_K, R)
        else:
            q = _group_quants(QTYPE, p0_ptr, p1_ptr, r3, t3, i3, s0, s1)
        t_next = tl.minimum(k0 // 16 + NT + groups, last_group)
        mul_next, sub_next = _group_scales(QTYPE, p0_ptr, p1_ptr, p2_ptr, p3_ptr, r3, t_next, s0, s1, s2, s3)
        w = mul * q - sub if QTYPE == Q4_K or QTYPE == Q4_K_PLANAR or QTYPE == Q4_K_ROWS else mul * q  # noqa: SIM109
        mul, sub = mul_next, sub_next
        w = tl.reshape(w, (BLOCK_N, BLOCK_K))
        if BF16_AS_F32:
            xt = xt.to(tl.float32)
            w = _bf16_in_f32(w)
        else:
            w = w.to(x_ptr.dtype.element_ty)
        if SWAP_AB:
            acc = tl.dot(w, tl.trans(xt), acc, input_precision=PRECISION)
        else:
            acc = tl.dot(xt, tl.trans(w), acc, input_precision=PRECISION)
    if SWAP_AB:
        acc = tl.trans(acc)
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    at = rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptr + at, acc.to(y_ptr.dtype.element_ty), mask=inside)
    else:
        at_ws = rm.to(tl.int64)[:, None] * N + rn[None, :]
        sum_splits(ws_ptr, y_ptr, lock_ptr, acc, at_ws, at, inside, pid, M * N, 0.0, SPLIT_K)
