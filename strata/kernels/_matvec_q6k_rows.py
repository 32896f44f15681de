"""Q6_K matvec on int8 x over planes regrouped by rows: a warp's lanes take 32 rows of one half.

The Q6_K counterpart of `_matvec_q4k_rows`: quant_pack's Q6_K "rows" layout (`interleave_q6k_rows`)
regroups Q6_K's planes (ql, qh, scales, d) by R rows, so that each 16-byte unit of a half
super-block's quants of R rows lies side by side. A lane takes one row and a whole 128-element half:
4 loads of ql, 2 of qh, its 8 scales in one 8-byte load and d; x's words and scales dx are one
address across the warp's lanes (a broadcast). The weights are the Q6_K int8 kernel's
(`_matvec_q6k_int8`: four 6-bit values a word, minus 32 per byte without borrows) and so are the
products per 16 elements, d * scale * dx * dot; they are summed in another order. On an H100
(benchmarks/gpu_q4k_rows.py, RESULTS.md fourteenth session) it ran the 7B's v, down and output head
1.43x, 1.55x and 1.41x as fast as that kernel at its default tiles (98 % of copy bandwidth on the head).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from strata.kernels._bits import split_range, store_rows
from strata.kernels._int8_x import _dp4a
from strata.kernels.kv_in_matvec import kv_prologue
from strata.kernels.pdl import await_inputs, launch_args
from strata.kernels.quant_pack import ROWS


@dataclass(frozen=True)
class Q6KRowsConfig:
    """`rows` per group (the layout's grouping), K split `split_k` ways (in halves of super-blocks), a
    warp per 32 rows, `prefetch`: the next half's quants loaded before this one's products, `preload`:
    the first half's loaded before the PDL wait."""

    rows: int = ROWS
    split_k: int = 1
    prefetch: bool = False
    preload: bool = False


def q6k_rows_config(n: int, k: int, rows: int, num_sms: int, halves_a_split: int = 0) -> Q6KRowsConfig:
    """The launch for an (n, k) Q6_K weight regrouped by `rows` rows: K split (in powers of two) until
    about 16 warps per SM are launched, at most 32 ways and at most one a half; prefetch only
    unsplit. From the H100 sweep (RESULTS.md, fourteenth session) at 64 rows: the 7B's v (8 groups)
    and down (56) ran best split 32 (3.59 and 24.38 us; 16: 4.42 and 24.81), its output head (2,376
    groups) unsplit with prefetch (151.8 us; without 157.9 at 32 rows); this rule picks each.
    `halves_a_split` (STRATA_Q6K_HALVES; 0: that rule) splits K so that a program takes that many
    halves: `split_range` gives each split cdiv(halves, split), so the rule's 32 splits of the 0.5B's
    38 halves are 19 programs of two halves and 13 empty ones, where 1 gives 38 of one."""
    halves = k // 128
    if halves_a_split:
        split = -(-halves // halves_a_split)
        return Q6KRowsConfig(rows, split, prefetch=split == 1)
    per_split = -(-n // rows) * (rows // 32)
    cap = min(32, 1 << (halves - 1).bit_length())
    split = 1
    while split < cap and per_split * split < 16 * num_sms:
        split *= 2
    return Q6KRowsConfig(rows, split, prefetch=split == 1)


@triton.jit
def q6_k_rows_int8_matvec_kernel(
    xq_ptr, xd_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, ql_ptr, qh_ptr, sc_ptr, d_ptr,
    N, K, stride_ys, stride_ym,
    R: tl.constexpr, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, USE_ASM: tl.constexpr,
    PREFETCH: tl.constexpr = False, PDL: tl.constexpr = False,
    M: tl.constexpr = 1, M_PAD: tl.constexpr = 1, PRELOAD: tl.constexpr = False,
    kv_pos_ptr=None, kv_slot_ptr=None, kv_freq_ptr=None, k_cache_ptr=None, v_cache_ptr=None, rope_scale=1.0,
    stride_cache=0, HEAD_DIM: tl.constexpr = 0,
):  # fmt: skip
    """Program (g, split) sums rows g * R .. over its split's halves (128 elements) for M rows of x
    (M_PAD, their next power of two); every x row meets the quants loaded once.
    PRELOAD: the first half's quants loaded before the PDL wait (weights are never written by a
    kernel; an empty split loads the last half and leaves it unused). The same sums either way.
    HEAD_DIM > 0: every row is v's, written to v's cache too (`kv_in_matvec.store_kv`)."""
    grp = tl.program_id(0)
    n_half = K // 128
    lo, hi = split_range(n_half, 1, SPLIT_K)
    planes = (  # each group's start: ql and qh in int32 words, the scales in bytes, d in fp16s
        ql_ptr + grp * (n_half * 16 * R),
        qh_ptr + grp * (n_half * 8 * R),
        sc_ptr + grp * (n_half * 8 * R),
        d_ptr + grp * (n_half // 2 * R),
    )
    rows = grp * R + tl.arange(0, R)
    kv = (kv_pos_ptr, kv_slot_ptr, kv_freq_ptr, k_cache_ptr, v_cache_ptr, rope_scale, stride_cache)
    if HEAD_DIM > 0:  # (a constant's branch: kv's pointers are None without the K/V write)
        kv = kv_prologue(rows, *kv, M, M_PAD, HEAD_DIM, False, ROTATES=False)
    if PRELOAD:
        first = _quants(planes, tl.minimum(lo, n_half - 1), R)
    await_inputs(PDL)
    acc = tl.zeros((R, 2, 2), tl.float32) if M == 1 else tl.zeros((M_PAD, R), tl.float32)
    if PREFETCH:
        following = first if PRELOAD else _quants(planes, lo, R)
        for half in range(lo, hi):
            these = following
            following = _quants(planes, tl.minimum(half + 1, hi - 1), R)
            acc = _step(acc, these, xq_ptr, xd_ptr, half, K // 32, R, USE_ASM, M, M_PAD)
    else:
        start = lo
        if PRELOAD:
            if lo < hi:
                acc = _step(acc, first, xq_ptr, xd_ptr, lo, K // 32, R, USE_ASM, M, M_PAD)
            start = lo + 1
        for half in range(start, hi):
            acc = _step(acc, _quants(planes, half, R), xq_ptr, xd_ptr, half, K // 32, R, USE_ASM, M, M_PAD)
    sums = tl.sum(tl.sum(acc, 2), 1)[None, :] if M == 1 else acc
    store_rows(y_ptr, out_ptr, lock_ptr, sums, rows, N, stride_ys, stride_ym, M, M_PAD, b_ptr, HAS_BIAS,
               SPLIT_K, kv, 0, 0, HEAD_DIM, False, R)  # fmt: skip


@triton.jit
def _step(acc, quants, xq_ptr, xd_ptr, half, n_sub, R: tl.constexpr, USE_ASM: tl.constexpr, M: tl.constexpr,
          M_PAD: tl.constexpr):  # fmt: skip
    """acc plus one half's products with each row of x: (R, 2, 2) for one row, else (M_PAD, R), row
    m's added through a select (x row m's words start n_sub * 8 words on, its scales n_sub on)."""
    if M == 1:
        acc += _products(*quants, xq_ptr, xd_ptr, half, R, USE_ASM)
    else:
        for m in tl.static_range(M):
            part = _products(*quants, xq_ptr + m * n_sub * 8, xd_ptr + m * n_sub, half, R, USE_ASM)
            acc += tl.where(tl.arange(0, M_PAD)[:, None] == m, tl.sum(tl.sum(part, 2), 1)[None, :], 0.0)
    return acc


@triton.jit
def _merged(ptr, units, R: tl.constexpr):
    """The int32 words of 16-byte units `units` (U,) of R rows, each unit's rows side by side, loaded
    with rows and words as one contiguous dimension (a lane per row in every Triton version, see
    `_matvec_q4k_rows._rows_first`) and returned as (R, U, 4)."""
    t = tl.load(ptr + units[:, None] * (R * 4) + tl.arange(0, R * 4)[None, :])
    return tl.permute(tl.reshape(t, (units.shape[0], R, 4)), (1, 0, 2))


@triton.jit
def _quants(planes, half, R: tl.constexpr):
    """Half `half`'s ql words (R, 2 (32-byte chunk h), 2 (16-element group q), 4), qh words (R, 1, 2, 4),
    its 8 scales (R, 8) and d (R,) as fp32."""
    ql_ptr, qh_ptr, sc_ptr, d_ptr = planes
    ql = tl.reshape(_merged(ql_ptr, half * 4 + tl.arange(0, 4), R), (R, 2, 2, 4))
    qh = tl.reshape(_merged(qh_ptr, half * 2 + tl.arange(0, 2), R), (R, 1, 2, 4))
    sc = tl.reshape(tl.load(sc_ptr + half * (8 * R) + tl.arange(0, R * 8)), (R, 8))
    r = tl.arange(0, R)
    d = tl.load(d_ptr + (half // 2) * R + tl.where(r < R, r, 0)).to(tl.float32)  # select: one a lane
    return ql, qh, sc, d


@triton.jit
def _products(ql, qh, sc, d, xq_ptr, xd_ptr, half, R: tl.constexpr, USE_ASM: tl.constexpr):
    """The (R, 2, 2) scaled sums of half `half`'s four sub-blocks, per (h, 16-element group): sub-block
    s = 2 n + h takes ql's nibble n and qh's bits 2s, 2s + 1; scale index 2s + q."""
    h = tl.arange(0, 2)[None, :, None, None]
    scales = tl.split(tl.permute(tl.reshape(sc, (R, 2, 2, 2)), (0, 2, 3, 1)))  # per n: (R, h, q)
    out = tl.zeros((R, 2, 2), tl.float32)
    for n in tl.static_range(2):
        q6 = ((ql >> (4 * n)) & 0x0F0F0F0F) | (((qh >> (2 * (2 * n + h))) & 0x03030303) << 4)
        w = (((q6.to(tl.uint32, bitcast=True) | 0x80808080) - 0x20202020) ^ 0x80808080).to(
            tl.int32, bitcast=True
        )
        sub = half * 4 + 2 * n + tl.arange(0, 2)  # (h,) x's sub-blocks
        units = sub[:, None] * 2 + tl.arange(0, 2)[None, :]  # (h, q): 16-byte units of x's words
        x_at = xq_ptr + units[:, :, None] * 4 + (tl.arange(0, R * 4) % 4)[None, None, :]
        x = tl.permute(tl.reshape(tl.load(x_at), (2, 2, R, 4)), (2, 0, 1, 3))  # (R, h, q, 4)
        dot = tl.sum(_dp4a(w, x, tl.zeros_like(w), USE_ASM, SIGNED_A=True), 3)  # (R, h, q)
        r = tl.arange(0, R)[:, None]
        # (R, h), one a lane: the hint hides sub's contiguity along h, which Triton 3.9 would give 2 lanes
        # (16 x 2, converted with barriers every step; a select on r < R folds away and hides nothing)
        dx = tl.load(xd_ptr + tl.max_contiguous(sub[None, :] + 0 * r, [1, 1]))
        scale = d[:, None, None] * scales[n].to(tl.float32)  # exact, as dequantize's d * sc
        out += scale * dot.to(tl.float32) * dx[:, :, None]
    return out


def q6_k_rows_int8_matvec(
    xq: torch.Tensor,
    xd: torch.Tensor,
    planes: tuple[torch.Tensor, ...],
    n: int,
    k: int,
    out: torch.Tensor,
    config: Q6KRowsConfig,
    *,
    bias: torch.Tensor | None = None,
    use_asm: bool = True,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
    kv: dict[str, object] | None = None,
) -> torch.Tensor:
    """out (M, n) = x @ W^T (+ bias) for M rows of x quantized by
    `int8_inputs.quantize_x(x, planar=False)` (xq, xd; element order) and W's Q6_K planes as
    `quant_pack.interleave_q6k_rows(planes, config.rows)` makes them. Under split-K, `workspace` is
    (fp32 partials (split_k, M, n), int32 counters of at least ceil(n / rows), zero). `kv`: a
    `kv_in_matvec.KVWrite`'s kernel arguments (`v_only`) for rows that are v's, written to its cache too."""
    c = config
    m = xq.shape[0]
    if c.split_k > 1 and workspace is None:
        raise ValueError("split_k > 1 needs workspace=(partials (split_k, M, n) fp32, zeroed int32 counters)")
    ql, qh, sc, d = planes
    y, locks = workspace if workspace is not None else (out, out)
    q6_k_rows_int8_matvec_kernel[(triton.cdiv(n, c.rows), c.split_k)](
        xq, xd, y, out, locks, out if bias is None else bias, ql.view(torch.int32), qh.view(torch.int32),
        sc, d, n, k, y.stride(0) if c.split_k > 1 else 0, out.stride(0),
        R=c.rows, SPLIT_K=c.split_k, HAS_BIAS=bias is not None, USE_ASM=use_asm, PREFETCH=c.prefetch,
        M=m, M_PAD=triton.next_power_of_2(m), PRELOAD=c.preload, num_warps=c.rows // 32,
        **(kv or {}), **launch_args(out.device),
    )  # fmt: skip
    return out
