"""Split-K paged decode attention: one new query token per sequence over its paged K/V context.

The cache is a layer's K and V from `strata.engine.kv_cache.KVCache`, each (num_slots, num_kv_heads,
head_dim); position j of sequence b lives at slot block_tables[b, j // block_size] * block_size +
j % block_size. Each sequence's context (or its last `window` positions) is cut into `num_splits`
chunks; the program for (sequence, KV head, chunk) runs an online softmax over its chunk for all G
query heads sharing that KV head (GQA: query head h reads KV head h // G) and writes a partial
(running max, sum of exponentials, unnormalized weighted V sum). A second kernel merges the partials
by log-sum-exp. With one split the first kernel normalizes and writes the output itself.

`num_splits` is fixed on the host (a captured CUDA graph keeps it), so it is chosen for the longest
context a step may have. On the device each sequence uses at most cdiv(its positions,
`min_split_len`) of them (`min_split_len` 256 under STRATA_LIVE_SPLITS=1 on the model path, else a
tile: splits of whole tiles, the partition every split count above it gives): the programs of the
splits beyond return at once, and a sequence left with one split has its output written by the
first kernel, the merge skipping it. A short context in a graph captured for long ones then costs
one split program a tile of its positions per KV head, and the merge reads only those partials.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from strata import env
from strata.kernels._paged_attention_merge import _live_splits, _merge_kernel, merge_quantization
from strata.kernels.int8_inputs import attach_int8
from strata.kernels.pdl import await_inputs, launch_args, prefetch_weights

_LOG2E = 1.4426950408889634
# Below this many positions a split's merge costs more than the parallelism gains.
MIN_SPLIT_LEN = 256


@triton.jit
def _chunk_range(ctx, lo, live, split, BLOCK_T: tl.constexpr):
    """Positions [start, end) of split `split` of the `live` ones over lo..ctx. Chunks are whole tiles
    so that only a chunk's last tile is partial."""
    chunk = tl.cdiv(tl.cdiv(ctx - lo, live), BLOCK_T) * BLOCK_T
    start = lo + split * chunk
    return start, tl.minimum(start + chunk, ctx)


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, block_tables_ptr, context_lens_ptr, out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
    qk_scale, window, block_size, num_splits, min_split_len,
    stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_bt, stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr, ONE_SPLIT: tl.constexpr, HAS_WINDOW: tl.constexpr, PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr, PDL: tl.constexpr = False, PREFETCH_KV: tl.constexpr = 0,
):  # fmt: skip
    """PREFETCH_KV 1 (under PDL 2): the first tile's K and V rows asked of L2 before the wait
    (`_prefetch_kv`); 2: loaded into registers before the wait (`_first_tile`), all but the new
    token's row, which the step writes, loaded after it (by the split that holds it)."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    slot0, k0, v0 = 0, 0, 0  # unused unless PREFETCH_KV is 2: the chunk loads its first tile in its loop
    if PREFETCH_KV:  # context lengths and block tables are read before the wait (see `_first_tile`)
        ctx = tl.load(context_lens_ptr + b)
        lo, live = _live_splits(ctx, window, num_splits, min_split_len, HAS_WINDOW)
        if PREFETCH_KV == 2:
            slot0, k0, v0 = _first_tile(
                k_ptr, v_ptr, block_tables_ptr, b, kvh, split, ctx, lo, live, block_size,
                stride_ks, stride_kh, stride_vs, stride_vh, stride_bt, D, D_PAD, BLOCK_T,
            )  # fmt: skip
        else:
            _prefetch_kv(
                k_ptr, v_ptr, block_tables_ptr, b, kvh, split, ctx, lo, live, block_size,
                stride_ks, stride_kh, stride_vs, stride_vh, stride_bt, D, D_PAD, BLOCK_T, PDL,
            )  # fmt: skip
        await_inputs(PDL)
    else:
        await_inputs(PDL)
        ctx = tl.load(context_lens_ptr + b)
        lo, live = _live_splits(ctx, window, num_splits, min_split_len, HAS_WINDOW)
    if split < live:
        _split_chunk(
            q_ptr, k_ptr, v_ptr, block_tables_ptr, out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
            qk_scale, block_size, num_splits, b, kvh, split, ctx, lo, live, slot0, k0, v0,
            stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_bt, stride_ob, stride_oh,
            NUM_HEADS, G, G_PAD, D, D_PAD, BLOCK_T, ONE_SPLIT, PRECISION, DOT_F32,
            PREFETCH_KV == 2,
        )  # fmt: skip


@triton.jit
def _first_tile(k_ptr, v_ptr, block_tables_ptr, b, kvh, split, ctx, lo, live, block_size,
                stride_ks, stride_kh, stride_vs, stride_vh, stride_bt,
                D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_T: tl.constexpr):  # fmt: skip
    """(slots, K, V) of the first tile of split `split`'s chunk, K and V (BLOCK_T, D_PAD) rows of the
    positions before the new token's (ctx - 1) only, zeros elsewhere: before the wait, those were
    written by earlier steps, the new token's by this one (after the wait: see `_split_chunk`). Context
    lengths and block tables are copied in before a decode graph's replay, never written by its
    kernels, so they can be read before the wait too."""
    start, end = _chunk_range(ctx, lo, live, split, BLOCK_T)
    pos = start + tl.arange(0, BLOCK_T)
    slot = _tile_slots(block_tables_ptr, b, pos, pos < end, block_size, stride_bt)
    old = (pos < end) & (pos < ctx - 1)
    idim = tl.arange(0, D_PAD)
    k = _tile_rows(k_ptr + kvh * stride_kh, slot, stride_ks, old, idim, D, "")
    return slot, k, _tile_rows(v_ptr + kvh * stride_vh, slot, stride_vs, old, idim, D, "")


@triton.jit
def _tile_slots(block_tables_ptr, b, pos, tm, block_size, stride_bt):
    """The cache slots of sequence b's positions `pos` (those under `tm`; 0 elsewhere)."""
    blk = tl.load(block_tables_ptr + b * stride_bt + pos // block_size, mask=tm, other=0)
    return blk.to(tl.int64) * block_size + pos % block_size  # int64: slot * stride can pass 2**31


@triton.jit
def _tile_rows(head_ptr, slot, stride_s, rows, idim, D: tl.constexpr, CACHE: tl.constexpr):
    """(BLOCK_T, D_PAD) cache rows of one KV head at `slot` where `rows` holds, zeros elsewhere
    (CACHE: the loads' cache modifier)."""
    at = head_ptr + slot[:, None] * stride_s + idim[None, :]
    return tl.load(at, mask=rows[:, None] & (idim < D)[None, :], other=0, cache_modifier=CACHE)


@triton.jit
def _prefetch_kv(k_ptr, v_ptr, block_tables_ptr, b, kvh, split, ctx, lo, live, block_size,
                 stride_ks, stride_kh, stride_vs, stride_vh, stride_bt,
                 D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """Before the wait: L2 prefetches of split `split`'s first tile of K and V rows (`_chunk_range`;
    read before the wait as `_first_tile` reads them). The new token's slot, which this step writes,
    may be among the rows, which is harmless: the write goes to L2 too, and a prefetch fills no
    register."""
    start, _ = _chunk_range(ctx, lo, live, split, BLOCK_T)
    pos = tl.minimum(start + tl.arange(0, BLOCK_T), tl.maximum(ctx - 1, 0))  # valid slots only
    blk = tl.load(block_tables_ptr + b * stride_bt + pos // block_size)
    slot = blk.to(tl.int64) * block_size + pos % block_size
    prefetch_weights(k_ptr + kvh * stride_kh, slot, stride_ks, 0, D, D_PAD // 2, PDL)
    prefetch_weights(v_ptr + kvh * stride_vh, slot, stride_vs, 0, D, D_PAD // 2, PDL)


@triton.jit
def _split_chunk(
    q_ptr, k_ptr, v_ptr, block_tables_ptr, out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
    qk_scale, block_size, num_splits, b, kvh, split, ctx, lo, live, slot0, k0, v0,
    stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_bt, stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr, ONE_SPLIT: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
    PRELOADED: tl.constexpr,
):  # fmt: skip
    """Split `split` of the `live` ones over positions lo..ctx: the output itself when it is the only
    one, else its partial. PRELOADED: (slot0, k0, v0) are the first tile's (`_first_tile`), the new
    token's row still to load."""
    start, end = _chunk_range(ctx, lo, live, split, BLOCK_T)

    ig = tl.arange(0, G_PAD)
    idim = tl.arange(0, D_PAD)
    heads = kvh * G + ig
    gm = ig < G
    dm = idim < D
    q_rows = q_ptr + b * stride_qb + heads[:, None] * stride_qh
    q = tl.load(q_rows + idim[None, :], mask=gm[:, None] & dm[None, :])
    q = q.to(k_ptr.dtype.element_ty)  # (G_PAD, D_PAD)
    if DOT_F32:
        q = q.to(tl.float32)

    m_i = tl.full((G_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((G_PAD,), tl.float32)
    acc = tl.zeros((G_PAD, D_PAD), tl.float32)
    k_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_vh
    loop_start = start
    if PRELOADED:
        if start < end:  # else an empty chunk (whole tiles past the context): nothing to attend
            pos = start + tl.arange(0, BLOCK_T)
            if ctx - 1 < start + BLOCK_T:  # the new token's row, written by this step, is in this tile
                new = pos == ctx - 1
                # Through L2 (.cg): a row that shares a 32-byte sector with one loaded before the
                # wait (rows of under 32 bytes a head) must not be read from a stale L1 line.
                k_new = _tile_rows(k_head, slot0, stride_ks, new, idim, D, ".cg")
                v_new = _tile_rows(v_head, slot0, stride_vs, new, idim, D, ".cg")
                k0 = tl.where(new[:, None], k_new, k0)
                v0 = tl.where(new[:, None], v_new, v0)
            m_i, l_i, acc = _attend(q, k0, v0, pos < end, m_i, l_i, acc, qk_scale, PRECISION, DOT_F32)
        loop_start = start + BLOCK_T
    for t0 in range(loop_start, end, BLOCK_T):
        pos = t0 + tl.arange(0, BLOCK_T)
        tm = pos < end
        slot = _tile_slots(block_tables_ptr, b, pos, tm, block_size, stride_bt)
        k = _tile_rows(k_head, slot, stride_ks, tm, idim, D, "")
        v = _tile_rows(v_head, slot, stride_vs, tm, idim, D, "")
        m_i, l_i, acc = _attend(q, k, v, tm, m_i, l_i, acc, qk_scale, PRECISION, DOT_F32)

    out_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + idim[None, :]
    if ONE_SPLIT or live == 1:
        _store_output(out_ptrs, acc, l_i, gm[:, None] & dm[None, :])
    else:
        # Partials: (batch, NUM_HEADS, num_splits) for m and l, (..., D_PAD) for acc, contiguous.
        row = (b * NUM_HEADS + heads) * num_splits + split
        tl.store(part_m_ptr + row, m_i, mask=gm)
        tl.store(part_l_ptr + row, l_i, mask=gm)
        tl.store(part_acc_ptr + row[:, None] * D_PAD + idim[None, :], acc, mask=gm[:, None])


@triton.jit
def _attend(q, k, v, tm, m_i, l_i, acc, qk_scale, PRECISION: tl.constexpr, DOT_F32: tl.constexpr):
    """One tile of the online softmax: (m_i, l_i, acc) updated with positions `tm` of K and V
    (BLOCK_T, D_PAD). The tile's first position is always inside the chunk, so the new max is finite."""
    if DOT_F32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (G_PAD, BLOCK_T), log2 units
    s = tl.where(tm[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _store_output(out_ptrs, acc, l_i, mask):
    """acc / l_i, the attention output of a whole context. l_i is 0 only for an empty context:
    zeros are written then instead of 0/0."""
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptrs, out.to(out_ptrs.dtype.element_ty), mask=mask)


@functools.cache
def _shared_memory(device: torch.device) -> int:
    """The shared memory a block may take on `device`, in bytes, as Triton's launch checks it (232,448
    on an H100); 0 on the CPU."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])


def default_launch(head_dim: int, element_size: int, shared_memory: int) -> tuple[int, int | None]:
    """(block_t, num_stages) when the caller names neither: 128 positions a loop step in two stages
    where K's and V's tiles, double-buffered, fit in three quarters of the block's `shared_memory`
    (16-bit caches of head_dim <= 128 on an H100's 227 KB), else 64 in Triton's default stages.
    Measured (H100, 2026-12-06, in CUDA graphs at the chosen split count, `gpu_attention_graph.py`):
    1.02-1.44x on every case (contexts 1k-32k, 1-32 sequences, head_dim 64 and 128); the 0.5B's
    decode at 32k 1.111x end to end."""
    tiles = 2 * 2 * 128 * triton.next_power_of_2(head_dim) * element_size
    return (128, 2) if tiles <= shared_memory * 3 // 4 else (64, None)


def choose_num_splits(
    batch: int,
    num_kv_heads: int,
    max_context_len: int,
    num_sms: int = 132,
    min_split_len: int = MIN_SPLIT_LEN,
    max_splits: int = 64,
    programs_per_sm: int = 2,
) -> int:
    """Splits per sequence: enough (sequence, KV head, split) programs for `programs_per_sm` per SM,
    but no split shorter than `min_split_len` positions (below that the merge costs more than the
    parallelism gains), and at most `max_splits`."""
    want = triton.cdiv(programs_per_sm * num_sms, max(1, batch * num_kv_heads))
    by_len = triton.cdiv(max(1, max_context_len), min_split_len)
    return max(1, min(want, by_len, max_splits))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    block_size: int,
    scale: float | None = None,
    window: int | None = None,
    num_splits: int | None = None,
    max_context_len: int | None = None,
    min_split_len: int = 1,
    out: torch.Tensor | None = None,
    max_splits: int = 64,
    programs_per_sm: int = 2,
    split_len: int = MIN_SPLIT_LEN,
    block_t: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    merge_warps: int | None = None,
    int8_order: bool | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its paged context; returns (batch, heads, head_dim).

    q: (batch, num_heads, head_dim); k_cache, v_cache: (num_slots, num_kv_heads, head_dim) with
    contiguous rows; block_tables: (batch, max_blocks) int32; context_lens: (batch,) int32, each >= 1
    and counting the new token (whose K/V must already be written). `scale` defaults to
    1/sqrt(head_dim); `window` keeps only the last `window` positions (sliding-window layers).
    `num_splits` defaults to `choose_num_splits` over `max_context_len` (an upper bound known on the
    host; by default the block table's capacity; `split_len`, `max_splits` and `programs_per_sm`
    passed on as its min_split_len, max_splits and programs_per_sm), so
    choosing never syncs with the device. More than 64 splits are merged in chunks of 64. On the
    device each sequence uses at most cdiv(its positions, max(`min_split_len`, block_t)) of them (1, the
    default: one a tile, which partitions the context as all of them would; MIN_SPLIT_LEN: about what
    `choose_num_splits` would give the context itself).

    `block_t` (positions a loop step), `num_warps`, `num_stages` (the split kernel's software
    pipelining depth; None: Triton's default) and `merge_warps` (the merge kernel's; None:
    `num_warps`) are launch choices: the same result up to rounding
    (block_t moves the online softmax's rescaling points). Without `block_t`, `default_launch` picks
    it and (unless given) the stages. `int8_order` (STRATA_QUANT_IN_MERGE): the merge kernel, where
    one runs, also quantizes the output for an int8 matvec in that order, attached to it
    (`int8_inputs.attach_int8`; `merge_quantization`).
    """
    if q.dim() != 3 or k_cache.dim() != 3 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"q must be (batch, heads, head_dim) and k/v caches (num_slots, kv_heads, head_dim) alike; "
            f"got q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}"
        )
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    if k_cache.shape[2] != head_dim or num_heads % num_kv_heads:
        raise ValueError(
            f"q has {num_heads} heads of dim {head_dim}; the cache has {num_kv_heads} KV heads of dim "
            f"{k_cache.shape[2]} (heads must be a multiple of KV heads, dims equal)"
        )
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or context_lens.shape != (batch,):
        raise ValueError(
            f"block_tables must be ({batch}, max_blocks) and context_lens ({batch},); got "
            f"{tuple(block_tables.shape)} and {tuple(context_lens.shape)}"
        )
    if block_tables.dtype != torch.int32 or context_lens.dtype != torch.int32:
        raise TypeError(
            f"block_tables and context_lens must be int32, got {block_tables.dtype}, {context_lens.dtype}"
        )
    if k_cache.stride(2) != 1 or v_cache.stride(2) != 1 or q.stride(2) != 1 or block_tables.stride(1) != 1:
        raise ValueError("q, k_cache, v_cache and block_tables need a contiguous last dim")
    if block_t is None:
        block_t, auto_stages = default_launch(head_dim, k_cache.element_size(), _shared_memory(q.device))
        num_stages = num_stages or auto_stages
    if block_t < 16 or block_t & (block_t - 1):
        raise ValueError(f"block_t must be a power of two >= 16 (tl.dot's minimum), got {block_t}")
    if merge_warps is not None and (merge_warps < 1 or merge_warps & (merge_warps - 1)):
        raise ValueError(f"merge_warps must be a power of two (Triton's warps), got {merge_warps}")
    if min(max_splits, programs_per_sm, num_splits or 1, num_stages or 1) < 1:
        raise ValueError(
            f"num_splits, max_splits, programs_per_sm and num_stages must be >= 1, got {num_splits}, "
            f"{max_splits}, {programs_per_sm} and {num_stages}"
        )
    if block_size < 1 or (window is not None and window < 1) or min(min_split_len, split_len) < 1:
        raise ValueError(
            f"block_size, window, min_split_len and split_len must be >= 1, got {block_size}, {window}, "
            f"{min_split_len} and {split_len}"
        )
    # A split of fewer positions than a tile would hold an empty chunk (chunks are whole tiles): with
    # at least a tile a split, a short context in a graph captured for long ones runs only its filled
    # splits and merges only their partials. The same chunks and the same bits as counting every split.
    min_split_len = max(min_split_len, block_t)
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(
            f"out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim, got {tuple(out.shape)}"
        )
    if max_context_len is None:
        max_context_len = block_tables.shape[1] * block_size
    if window is not None:
        max_context_len = min(max_context_len, window)
    if num_splits is None:
        num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
        num_splits = choose_num_splits(
            batch, num_kv_heads, max_context_len, num_sms, min_split_len=split_len, max_splits=max_splits,
            programs_per_sm=programs_per_sm,
        )  # fmt: skip
    group = num_heads // num_kv_heads
    d_pad = triton.next_power_of_2(head_dim)
    # tl.dot needs at least 16 rows; the padded query rows are masked out.
    g_pad = max(16, triton.next_power_of_2(group))
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    # Triton's interpreter (3.9) computes bf16 tl.dot wrongly; there the dots run in fp32 instead.
    dot_f32 = k_cache.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    # fp32 dots stay fp32 (not tf32); 16-bit inputs take the default.
    precision = "ieee" if k_cache.dtype == torch.float32 or dot_f32 else None
    part_m = part_l = part_acc = out  # unused placeholders with one split
    if num_splits > 1:
        part_m = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(batch, num_heads, num_splits, d_pad, dtype=torch.float32, device=q.device)
    _split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_m, part_l, part_acc,
        scale * _LOG2E, window or 0, block_size, num_splits, min_split_len,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        block_tables.stride(0), out.stride(0), out.stride(1),
        NUM_HEADS=num_heads, G=group, G_PAD=g_pad, D=head_dim, D_PAD=d_pad, BLOCK_T=block_t,
        ONE_SPLIT=num_splits == 1, HAS_WINDOW=window is not None, PRECISION=precision, DOT_F32=dot_f32,
        PREFETCH_KV=env.attention_prefetch(),
        num_warps=num_warps,
        **({} if num_stages is None else {"num_stages": num_stages}),
        **launch_args(q.device),
    )  # fmt: skip
    int8 = None
    if num_splits > 1:
        quant, int8 = merge_quantization(out, int8_order)
        _merge_kernel[(batch, num_heads)](
            out, part_m, part_l, part_acc, context_lens, window or 0, num_splits, min_split_len,
            out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, D=head_dim, D_PAD=d_pad, S_PAD=triton.next_power_of_2(num_splits),
            HAS_WINDOW=window is not None, **quant,
            num_warps=merge_warps or num_warps,
            **launch_args(q.device),
        )  # fmt: skip
    return out if int8 is None else attach_int8(out, {bool(int8_order): int8})
