"""Q4_K matvec on int8 x over row-interleaved planes: a warp's lanes take 32 rows of one sub-block.

The planar int8 kernel (`_matvec_q4k_int8`) lays a warp's lanes along one row's sub-blocks: each
16-byte weight load is coalesced, but x (32 bytes a sub-block, twice the weight's 16) and every scale
differ from lane to lane, so per 512 bytes of weights a warp also moves about 600 bytes of x and
scales through L1, which Nsight Compute shows as the bound (L1/TEX ~87 %, DRAM ~43 %). Here the planes
are regrouped by R rows (quant_pack's "rows" layout, `interleave_rows`): sub-block s of rows
g * R .. g * R + R - 1 lie side by side, so a warp's 32 lanes read 32 rows' words of one sub-block in
one 512-byte run, and x, dx and the x sums are the same address for every lane (one L1 wavefront each,
a broadcast). A lane takes a whole super-block of its row: 8 word loads, one 8-byte load each of its
scales and mins (a super-block's 16 scale bytes are one record per row) and one word of d and dmin.
Each row's products are those of the planar int8 kernel (`_row_part`), summed in another order: the
tests hold it to the same tolerance.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from strata.kernels._bits import exact_float, fp16_halves, split_range, store_rows
from strata.kernels._int8_x import _dp4a
from strata.kernels.pdl import await_inputs, launch_args
from strata.kernels.quant_pack import ROWS


@dataclass(frozen=True)
class RowsConfig:
    """One launch of the row-interleaved kernel: `rows` per group (the layout's grouping), `step`
    units a step, K split `split_k` ways (in units), `num_warps` (a warp per 32 rows and unit of a
    step), `xvec` (dx and the x sums in 16-byte loads), `prefetch` (the next step's weights loaded
    before this step computes), `stream` (the weight words loaded past L1), `subs` (the sub-blocks of
    a unit, which one lane takes: 8, a whole super-block, or 4 or 2, more lanes on short rows),
    `preload` (the first step's weights loaded before the PDL wait; not with `prefetch`)."""

    rows: int = ROWS
    step: int = 1
    split_k: int = 1
    num_warps: int = ROWS // 32
    xvec: bool = False
    prefetch: bool = False
    stream: bool = False
    subs: int = 8
    preload: bool = False


def rows_config(n: int, k: int, rows: int, num_sms: int) -> RowsConfig:
    """The launch for an (n, k) weight regrouped by `rows` rows: one super-block a step and x's scales
    one a lane (the forms that compile without barriers in Triton 3.9 as in 3.6; `compile_check`), a
    warp per 32 rows, no prefetch, and K split (in powers of two) until about 16 warps per SM are
    launched, at most 32 ways and at least about two super-blocks a split. From
    benchmarks/gpu_q4k_rows.py on an H100 (RESULTS.md, thirteenth session): prefetch lost on every
    7B shape (0.83-0.95x), and the best splits were 8 (q+k+v, o: 14 super-blocks a row), 2
    (gate+up: 1,184 warps a split) and 32 (down: 112); this rule picks each of them."""
    warps = rows // 32
    per_split = -(-n // rows) * warps
    pairs = -(-k // 512)  # super-blocks in twos, rounded up
    cap = min(32, 1 << (pairs - 1).bit_length())  # that, rounded up to a power of two
    split = 1
    while split < cap and per_split * split < 16 * num_sms:
        split *= 2
    return RowsConfig(rows, 1, split, warps, xvec=False, prefetch=False)


@triton.jit
def q4_k_rows_int8_matvec_kernel(
    xq_ptr, xd_ptr, xs_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, qs_ptr, scm_ptr, dm_ptr,
    N, K, stride_ys, stride_ym,
    R: tl.constexpr, NB: tl.constexpr, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    USE_ASM: tl.constexpr, EVEN: tl.constexpr = False, XVEC: tl.constexpr = False,
    PREFETCH: tl.constexpr = False, PDL: tl.constexpr = False,
    M: tl.constexpr = 1, M_PAD: tl.constexpr = 1, STREAM: tl.constexpr = False, SUBS: tl.constexpr = 8,
    PRELOAD: tl.constexpr = False,
):  # fmt: skip
    """Program (g, split) sums rows g * R .. over its split's units of SUBS sub-blocks (8: a
    super-block), NB a step, for M rows of x (M_PAD, their next power of two). A lane takes one row
    and a whole unit: its sub-blocks' words, their scale and min bytes in one load each, d and dmin in
    another; every x row meets the words loaded once. EVEN: the steps cover the units exactly (no
    masks). XVEC: dx and the x sums in 16-byte loads (`_x`; Triton 3.9 converts them every step, 3.6
    does not). NB > 1 also converts under 3.9 (`compile_check` counts the barriers). PREFETCH: each
    step's weights are loaded before the step before it computes (the last step reloads its own
    instead of reading past the end). STREAM: the weight words loaded past L1 (`_weights`). PRELOAD
    (not with PREFETCH): the first step's weights loaded before the PDL wait (weights are never
    written by a kernel), masked to the split's units, so an empty split reads nothing; the loop then
    starts at the second step. The same sums in every variant."""
    g = tl.program_id(0)
    n_blk = K // 256
    lo, hi = split_range(K // (32 * SUBS), NB, SPLIT_K)
    planes = (qs_ptr + g * (n_blk * 8 * R * 4), scm_ptr + g * (n_blk * R * 16), dm_ptr + g * (n_blk * R))
    x = (xq_ptr, xd_ptr, xs_ptr, K // 32)
    start = lo
    if PRELOAD:
        b = lo + tl.arange(0, NB)
        first = _weights(planes, b, b < hi, R, False, STREAM, SUBS)
        start = lo + NB
    await_inputs(PDL)
    acc = tl.zeros((R, NB, SUBS), tl.float32) if M == 1 else tl.zeros((M_PAD, R, NB), tl.float32)
    if PRELOAD:  # noqa: SIM102 - a constexpr if: without PRELOAD, `first` is not defined
        if lo < hi:
            acc = _step(acc, first, x, b, b < hi, R, EVEN, XVEC, USE_ASM, M, M_PAD, SUBS)
    if PREFETCH:
        b = lo + tl.arange(0, NB)
        following = _weights(planes, b, b < hi, R, EVEN, STREAM, SUBS)
        for b0 in range(lo, hi, NB):
            b = b0 + tl.arange(0, NB)
            bv = b < hi
            these = following
            ahead = b + NB
            ahead = tl.where(ahead < hi, ahead, b)  # in range, so that no mask is needed when EVEN
            following = _weights(planes, ahead, bv, R, EVEN, STREAM, SUBS)
            acc = _step(acc, these, x, b, bv, R, EVEN, XVEC, USE_ASM, M, M_PAD, SUBS)
    else:
        for b0 in range(start, hi, NB):
            b = b0 + tl.arange(0, NB)
            bv = b < hi
            weights = _weights(planes, b, bv, R, EVEN, STREAM, SUBS)
            acc = _step(acc, weights, x, b, bv, R, EVEN, XVEC, USE_ASM, M, M_PAD, SUBS)
    sums = tl.sum(tl.sum(acc, 2), 1)[None, :] if M == 1 else tl.sum(acc, 2)
    rows = g * R + tl.arange(0, R)
    store_rows(y_ptr, out_ptr, lock_ptr, sums, rows, N, stride_ys, stride_ym,
               M, M_PAD, b_ptr, HAS_BIAS, SPLIT_K)  # fmt: skip


@triton.jit
def _step(acc, weights, x, b, bv, R: tl.constexpr, EVEN: tl.constexpr, XVEC: tl.constexpr,
          USE_ASM: tl.constexpr, M: tl.constexpr, M_PAD: tl.constexpr, SUBS: tl.constexpr):  # fmt: skip
    """acc plus the products of one step's weights with each row of x: (R, NB, SUBS) per sub-block
    for one row, else (M_PAD, R, NB) per unit, row m's added through a select."""
    xq_ptr, xd_ptr, xs_ptr, n_sub = x
    if M == 1:
        acc += _products(*weights, *_x((xq_ptr, xd_ptr, xs_ptr), b, bv, R, EVEN, XVEC, SUBS), USE_ASM)
    else:
        for m in tl.static_range(M):
            xm = (xq_ptr + m * n_sub * 8, xd_ptr + m * n_sub, xs_ptr + m * n_sub)
            part = tl.sum(_products(*weights, *_x(xm, b, bv, R, EVEN, XVEC, SUBS), USE_ASM), 2)  # (R, NB)
            acc += tl.where(tl.arange(0, M_PAD)[:, None, None] == m, part[None, :, :], 0.0)
    return acc


@triton.jit
def _weights(planes, b, bv, R: tl.constexpr, EVEN: tl.constexpr, STREAM: tl.constexpr = False,
             SUBS: tl.constexpr = 8):  # fmt: skip
    """Units b (NB,) of SUBS sub-blocks of the group's R rows: words (R, NB, SUBS, 4) (`_rows_first`: a
    lane per row, a unit's sub-blocks in one lane), (R, NB, SUBS) sc and mn (contiguous bytes a lane),
    (R, NB, 1) the (d, dmin) pair of each unit's super-block; `bv` masks them unless EVEN; STREAM: the
    words bypass L1 (`.cg`: read once, they leave L1 to x and the scales). dm's offsets pass through a
    select, which hides their contiguity along the rows: one word a lane, in the words' lane layout (no
    conversion; see `_matvec_q4k_planar._loads`)."""
    qs, scm_ptr, dm_ptr = planes
    r2 = tl.arange(0, R)[:, None]
    r = r2[:, :, None]
    j = tl.arange(0, SUBS)[None, None, :]
    m3 = None if EVEN else bv[None, :, None]
    z = None if EVEN else 0
    words = _rows_first(
        tl.load(
            qs
            + (b[:, None] * SUBS + tl.arange(0, SUBS)[None, :])[:, :, None] * (R * 4)
            + tl.arange(0, R * 4)[None, None, :],
            mask=None if EVEN else bv[:, None, None],
            other=z,
            cache_modifier=".cg" if STREAM else "",
        ),
        R,
    )
    # Each unit's super-block and its sub-blocks' places in the record: whole super-blocks written as
    # b and j, so that the scale loads keep the contiguity that lays them out one a lane.
    blk, at = b, j
    if SUBS < 8:
        blk, at = b // (8 // SUBS), ((b % (8 // SUBS)) * SUBS)[None, :, None] + j
    scm_at = scm_ptr + (blk[None, :, None] * R + r) * 16 + at
    sc = tl.load(scm_at, mask=m3, other=z)
    mn = tl.load(scm_at + 8, mask=m3, other=z)
    bh = tl.where(bv, blk, 0)[None, :]
    pair = tl.load(dm_ptr + bh * R + r2, mask=None if EVEN else bv[None, :], other=z)
    return words, sc, mn, pair[:, :, None]


@triton.jit
def _rows_first(t, R: tl.constexpr):
    """(NB, S, R * 4) words, a row's four contiguous, -> (R, NB, S, 4). Loaded with rows and words as
    one contiguous dimension, every Triton version lays lanes along the rows (by contiguity, not by its
    order among equally contiguous dimensions, which 3.6 and 3.9 take opposite ways); the reshape and
    the permutation move no data."""
    return tl.permute(tl.reshape(t, (t.shape[0], t.shape[1], R, 4)), (2, 0, 1, 3))


@triton.jit
def _x(x, b, bv, R: tl.constexpr, EVEN: tl.constexpr, XVEC: tl.constexpr, SUBS: tl.constexpr = 8):
    """x for units b (NB,) of SUBS sub-blocks: its low and high words (R, NB, SUBS, 4) and (R, NB,
    SUBS) dx and sums, at one address across the rows (a broadcast). dx and the sums load one a lane
    through a select, or with XVEC (SUBS = 8) four a lane as (R, NB, 2, 4), reshaped."""
    xq_ptr, xd_ptr, xs_ptr = x
    r = tl.arange(0, R)[:, None, None]
    s = b[None, :, None] * SUBS + tl.arange(0, SUBS)[None, None, :]  # (1, NB, SUBS) sub-blocks
    m3 = None if EVEN else bv[None, :, None]
    m4 = None if EVEN else bv[None, :, None, None]
    z = None if EVEN else 0
    sb = b[:, None] * SUBS + tl.arange(0, SUBS)[None, :]  # (NB, SUBS)
    xq_at = xq_ptr + (sb * 8)[:, :, None] + (tl.arange(0, R * 4) % 4)[None, None, :]
    x_lo = _rows_first(tl.load(xq_at, mask=None if EVEN else bv[:, None, None], other=z), R)
    x_hi = _rows_first(tl.load(xq_at + 4, mask=None if EVEN else bv[:, None, None], other=z), R)
    if XVEC:
        q = tl.arange(0, 2)[None, None, :, None] * 4 + tl.arange(0, 4)[None, None, None, :]
        at = (b[None, :, None, None] * 8 + 0 * r[:, :, :, None]) + q
        xd = tl.reshape(tl.load(xd_ptr + at, mask=m4, other=z), (R, b.shape[0], 8))
        xs = tl.reshape(tl.load(xs_ptr + at, mask=m4, other=z), (R, b.shape[0], 8))
    else:
        sh = tl.where(bv[None, :, None], s, 0) + 0 * r
        xd = tl.load(xd_ptr + sh, mask=m3, other=z)
        xs = tl.load(xs_ptr + sh, mask=m3, other=z)
    return x_lo, x_hi, xd, xs


@triton.jit
def _products(words, sc, mn, pair, x_lo, x_hi, xd, xs, USE_ASM: tl.constexpr):
    """The (R, NB, 8) products of each row's sub-blocks with x, scaled: `_row_part` of the planar
    int8 kernel, element for element."""
    dot = _dp4a(words & 0x0F0F0F0F, x_lo, tl.zeros(words.shape, tl.int32), USE_ASM)
    dot = _dp4a((words >> 4) & 0x0F0F0F0F, x_hi, dot, USE_ASM)
    d, dmin = fp16_halves(pair)
    d_sc = d.to(tl.float32) * exact_float(sc.to(tl.int32), 0)
    d_mn = dmin.to(tl.float32) * exact_float(mn.to(tl.int32), 0)
    return d_sc * (tl.sum(dot, 3).to(tl.float32) * xd) - d_mn * xs


def q4_k_rows_int8_matvec(
    xq: torch.Tensor,
    xd: torch.Tensor,
    xs: torch.Tensor,
    planes: tuple[torch.Tensor, ...],
    n: int,
    k: int,
    out: torch.Tensor,
    config: RowsConfig,
    *,
    bias: torch.Tensor | None = None,
    use_asm: bool = True,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """out (M, n) = x @ W^T (+ bias) for M rows of x quantized by
    `int8_inputs.quantize_x(x, planar=True)` (xq, xd, xs) and W's planes as
    `quant_pack.interleave_rows(planes, config.rows)` makes them. Under split-K, `workspace` is (fp32
    partials (split_k, M, n), int32 counters of at least ceil(n / rows), zero)."""
    c = config
    m = xq.shape[0]
    if c.split_k > 1 and workspace is None:
        raise ValueError("split_k > 1 needs workspace=(partials (split_k, M, n) fp32, zeroed int32 counters)")
    if c.subs not in (2, 4, 8) or (c.xvec and c.subs != 8):
        raise ValueError(f"RowsConfig.subs must be 8, 4 or 2 (xvec with 8 only), got {c.subs}, xvec={c.xvec}")
    if c.preload and c.prefetch:
        raise ValueError("RowsConfig: preload and prefetch are exclusive (both load the first step ahead)")
    qs, scm, dm = planes
    y, locks = workspace if workspace is not None else (out, out)
    q4_k_rows_int8_matvec_kernel[(triton.cdiv(n, c.rows), c.split_k)](
        xq, xd, xs, y, out, locks, out if bias is None else bias, qs.view(torch.int32), scm,
        dm.view(torch.int32), n, k,
        y.stride(0) if c.split_k > 1 else 0, out.stride(0),
        R=c.rows, NB=c.step, SPLIT_K=c.split_k, HAS_BIAS=bias is not None, USE_ASM=use_asm,
        EVEN=k // (32 * c.subs) % c.step == 0, XVEC=c.xvec, PREFETCH=c.prefetch,
        M=m, M_PAD=triton.next_power_of_2(m), STREAM=c.stream, SUBS=c.subs, PRELOAD=c.preload,
        num_warps=c.num_warps, **launch_args(out.device),
    )  # fmt: skip
    return out
