"""The merge of split-K paged decode attention (`paged_attention`): a head's partials merged by
log-sum-exp into its output, by a second kernel or (`_merge_in_split`) by the head group's last split
to finish; and `_live_splits`, the rule both apply for how many of the splits a context fills."""

from __future__ import annotations

import triton
import triton.language as tl

from strata.kernels.pdl import await_inputs


@triton.jit
def _live_splits(ctx, window, num_splits, min_split_len, HAS_WINDOW: tl.constexpr):
    """(lo, n): the context's first attended position and how many of the `num_splits` splits it
    uses: cdiv(positions, min_split_len), at least one (the chunks, whole tiles, may be shorter)."""
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(ctx - window, 0)
    return lo, tl.minimum(num_splits, tl.maximum(tl.cdiv(ctx - lo, min_split_len), 1))


@triton.jit
def _merge_kernel(
    out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, context_lens_ptr,
    window, num_splits, min_split_len, stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, S_PAD: tl.constexpr,
    HAS_WINDOW: tl.constexpr, MERGE_CHUNK: tl.constexpr = 64,
    PDL: tl.constexpr = False,
):  # fmt: skip
    await_inputs(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    _, live = _live_splits(tl.load(context_lens_ptr + b), window, num_splits, min_split_len, HAS_WINDOW)
    if live > 1:  # one split wrote the output itself
        if S_PAD <= MERGE_CHUNK:
            _merge(out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, b, h, live, num_splits,
                   stride_ob, stride_oh, NUM_HEADS, D, D_PAD, S_PAD)  # fmt: skip
        else:
            _merge_chunks(out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, b, h, live, num_splits,
                          stride_ob, stride_oh, NUM_HEADS, D, D_PAD, MERGE_CHUNK)  # fmt: skip


@triton.jit
def _merge(out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, b, h, live, num_splits, stride_ob, stride_oh,
           NUM_HEADS: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, S_PAD: tl.constexpr):  # fmt: skip
    """Head h of sequence b: its `live` partials merged by log-sum-exp into the output."""
    isp = tl.arange(0, S_PAD)
    idim = tl.arange(0, D_PAD)
    sm = isp < live
    row = (b * NUM_HEADS + h) * num_splits + isp
    m = tl.load(part_m_ptr + row, mask=sm, other=float("-inf"))
    l_s = tl.load(part_l_ptr + row, mask=sm, other=0.0)
    acc = tl.load(part_acc_ptr + row[:, None] * D_PAD + idim[None, :], mask=sm[:, None], other=0.0)
    # out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s; empty chunks have m_s = -inf (weight 0).
    m_max = tl.max(m, 0)
    m_ref = tl.where(m_max > float("-inf"), m_max, 0.0)
    w = tl.exp2(m - m_ref)
    den = tl.sum(w * l_s, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + idim, out.to(out_ptr.dtype.element_ty), mask=idim < D)


@triton.jit
def _merge_chunks(
    out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, b, h, live, num_splits, stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """`_merge` over more splits than one (CHUNK, D_PAD) tile holds in registers: the largest running
    max first, then the weighted sums chunk by chunk."""
    idim = tl.arange(0, D_PAD)
    row0 = (b * NUM_HEADS + h) * num_splits
    m_max = float("-inf")
    for s0 in range(0, live, CHUNK):
        isp = s0 + tl.arange(0, CHUNK)
        m = tl.load(part_m_ptr + row0 + isp, mask=isp < live, other=float("-inf"))
        m_max = tl.maximum(m_max, tl.max(m, 0))
    m_ref = tl.where(m_max > float("-inf"), m_max, 0.0)
    den = 0.0
    num = tl.zeros((D_PAD,), tl.float32)
    for s0 in range(0, live, CHUNK):
        isp = s0 + tl.arange(0, CHUNK)
        sm = isp < live
        w = tl.exp2(tl.load(part_m_ptr + row0 + isp, mask=sm, other=float("-inf")) - m_ref)
        den += tl.sum(w * tl.load(part_l_ptr + row0 + isp, mask=sm, other=0.0), 0)
        acc_at = part_acc_ptr + (row0 + isp)[:, None] * D_PAD + idim[None, :]
        acc = tl.load(acc_at, mask=sm[:, None], other=0.0)
        num += tl.sum(acc * w[:, None], 0)
    out = num / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + idim, out.to(out_ptr.dtype.element_ty), mask=idim < D)


@triton.jit
def _merge_in_split(
    out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, lock_ptr, b, kvh, live, num_splits, stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, G: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, S_PAD: tl.constexpr,
):  # fmt: skip
    """The merge without a launch of its own (STRATA_ATTENTION_MERGE=split), after a split has stored
    its partials: the last of sequence b's `live` splits of KV head kvh to finish (counted in
    lock[b, kvh] by an atomic, as `_bits.sum_splits` counts split-K matvecs) merges that head group's
    G query heads and resets the counter for the next launch. The barrier makes this program's partial
    stores precede its release (the atomic is one thread's); the partials are read through L2 (.cg),
    where the other programs' stores landed.
    `_merge`'s arithmetic with its sums over splits taken in split order, one split at a time over a
    (G, D_PAD) tile: every value, a split's running max and sum too (loaded once per channel from the
    same address), stays in that tile's layout, so the merge moves nothing between threads (a (G,
    splits, D_PAD) tile reduced across splits took 53 barriers in its sm_90 build)."""
    tl.debug_barrier()
    lock = lock_ptr + b * (NUM_HEADS // G) + kvh
    if tl.atomic_add(lock, 1, sem="acq_rel", scope="gpu") == live - 1:
        G_POW: tl.constexpr = triton.next_power_of_2(G)
        ig = tl.arange(0, G_POW)
        idim = tl.arange(0, D_PAD)
        heads = kvh * G + ig
        rows = (b * NUM_HEADS + heads)[:, None] * num_splits + 0 * idim[None, :]  # (G_POW, D_PAD)
        gm = (ig < G)[:, None] & (idim < D_PAD)[None, :]
        zero = 0 * rows  # split numbers as (G_POW, D_PAD) masks: the interpreter takes no scalar in a mask
        m_max = tl.full((G_POW, D_PAD), float("-inf"), tl.float32)
        for s in tl.static_range(S_PAD):
            m_s = tl.load(
                part_m_ptr + rows + s, mask=gm & (zero + s < live), other=float("-inf"), cache_modifier=".cg"
            )
            m_max = tl.maximum(m_max, m_s)
        m_ref = tl.where(m_max > float("-inf"), m_max, 0.0)
        den = tl.zeros((G_POW, D_PAD), tl.float32)
        num = tl.zeros((G_POW, D_PAD), tl.float32)
        for s in tl.static_range(S_PAD):
            sm = gm & (zero + s < live)
            w = tl.exp2(
                tl.load(part_m_ptr + rows + s, mask=sm, other=float("-inf"), cache_modifier=".cg") - m_ref
            )
            den += w * tl.load(part_l_ptr + rows + s, mask=sm, other=0.0, cache_modifier=".cg")
            acc_at = part_acc_ptr + (rows + s) * D_PAD + idim[None, :]
            num += w * tl.load(acc_at, mask=sm, other=0.0, cache_modifier=".cg")
        out = num / tl.where(den > 0, den, 1.0)
        out_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + idim[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=(ig < G)[:, None] & (idim < D)[None, :])
        tl.store(lock, 0)
