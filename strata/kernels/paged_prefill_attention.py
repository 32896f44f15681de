"""Flash-attention prefill over the paged KV cache: each sequence's new tokens over its whole context.

The step's queries are the concatenation of each sequence's new tokens (sequence b owns rows
query_start[b]:query_start[b + 1]); their K/V are already in the cache, after the sequence's cached
prefix, so new token i of sequence b sits at position context_lens[b] - query_len_b + i. The cache is
a layer's K and V from `strata.engine.kv_cache.KVCache`, each (num_slots, num_kv_heads, head_dim);
position j of sequence b lives at slot block_tables[b, j // block_size] * block_size + j % block_size.

Tiles: the G = num_heads / num_kv_heads query heads that share a KV head are folded into the rows, so
a sequence has query_len * G rows for each KV head, row r being new token r // G in query head
kvh * G + r % G. The program for (row tile, sequence, KV head) holds BLOCK_M such rows and walks the
context in tiles of BLOCK_N keys with an online softmax (fp32, exp2 of log2(e)-scaled scores), doing
QK^T and PV with tl.dot. Folding the heads (rather than one head per program) loads each K/V tile
once for all G heads, G times less cache traffic for GQA models (Qwen2.5: G = 7), and works for any
G without padding heads. The key walk starts at 0 (or at the tile's first query's window start) and
stops after the tile's last query's position, so tiles wholly above the causal diagonal or below the
window are never loaded; the causal/window mask is applied on every tile (cheap next to the dots).
Grid: (cdiv(max_query_len * G, BLOCK_M), batch, num_kv_heads); tiles past a shorter sequence's rows
return at once, so `max_query_len` is only a host upper bound and the launch never syncs.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, block_tables_ptr, context_lens_ptr, query_start_ptr, out_ptr,
    qk_scale, window, block_size,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_bt, stride_ot, stride_oh,
    G: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    b = tl.program_id(1)
    kvh = tl.program_id(2)
    q_start = tl.load(query_start_ptr + b)
    num_rows = (tl.load(query_start_ptr + b + 1) - q_start) * G
    m0 = tile * BLOCK_M
    if m0 >= num_rows:
        return
    first_pos = tl.load(context_lens_ptr + b) - num_rows // G  # position of the first new token

    rows = m0 + tl.arange(0, BLOCK_M)
    idim = tl.arange(0, D_PAD)
    rm = rows < num_rows
    dm = idim < D
    tok = rows // G
    heads = kvh * G + rows % G
    q_pos = first_pos + tok
    row_mask = rm[:, None] & dm[None, :]
    # int64: token * stride can pass 2**31 for a long chunk of a fused QKV output.
    q = tl.load(
        q_ptr
        + (q_start + tok).to(tl.int64)[:, None] * stride_qt
        + heads[:, None] * stride_qh
        + idim[None, :],
        mask=row_mask,
        other=0,
    )
    q = q.to(k_ptr.dtype.element_ty)  # (BLOCK_M, D_PAD)
    if DOT_F32:
        q = q.to(tl.float32)

    # Keys any row of the tile may see: [lo, hi).
    hi = first_pos + (tl.minimum(m0 + BLOCK_M, num_rows) - 1) // G + 1
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(first_pos + m0 // G - window + 1, 0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        k_pos = n0 + tl.arange(0, BLOCK_N)
        km = k_pos < hi
        blk = tl.load(block_tables_ptr + b * stride_bt + k_pos // block_size, mask=km, other=0)
        slot = blk.to(tl.int64) * block_size + k_pos % block_size  # int64: slot * stride can pass 2**31
        kv_mask = km[:, None] & dm[None, :]
        k = tl.load(
            k_ptr + slot[:, None] * stride_ks + kvh * stride_kh + idim[None, :], mask=kv_mask, other=0
        )
        if DOT_F32:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        # Keys past hi are past every valid row's position, so the causal test masks them too.
        keep = k_pos[None, :] <= q_pos[:, None]
        if HAS_WINDOW:
            keep &= k_pos[None, :] > q_pos[:, None] - window
        s = tl.where(keep, s, float("-inf"))
        # With a window a row may see nothing in a tile the tile's first row needs; keep its m at -inf
        # but subtract 0 so that it gets alpha = p = 0 instead of exp2(-inf + inf) = NaN.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_new > float("-inf"), m_new, 0.0)
        alpha = tl.exp2(m_i - m_sub)
        p = tl.exp2(s - m_sub[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_ptr + slot[:, None] * stride_vs + kvh * stride_vh + idim[None, :], mask=kv_mask, other=0
        )
        if DOT_F32:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    # Every valid row sees at least its own key, so l_i > 0 there; padding rows are not stored.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_ptrs = out_ptr + (q_start + tok).to(tl.int64)[:, None] * stride_ot + heads[:, None] * stride_oh
    tl.store(out_ptrs + idim[None, :], out.to(out_ptr.dtype.element_ty), mask=row_mask)


def _default_tiles(d_pad: int, fp32: bool) -> tuple[int, int, int, int]:
    """(block_m, block_n, num_warps, num_stages) on the GPU, chosen for sm_90 from compiled register and
    shared-memory use (no spills), not yet from timings. fp32 dots (exact "ieee") get no tensor cores, so
    their tiles stay small; at head_dim 256 the key tile halves to keep the fp32 accumulator in registers."""
    if fp32:
        return (32, 32, 8, 2) if d_pad <= 128 else (32, 16, 8, 2)
    return (128, 64, 8, 3) if d_pad <= 128 else (64, 32, 8, 2)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start: torch.Tensor,
    *,
    block_size: int,
    max_query_len: int,
    scale: float | None = None,
    window: int | None = None,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its paged context; returns `out`.

    q: (num_tokens, num_heads, head_dim), any row strides, contiguous last dim; sequence b's queries
    are q[query_start[b]:query_start[b + 1]] (query_start: (batch + 1,) int32, cumulative; tokens
    past query_start[batch] are left untouched in `out`). context_lens: (batch,) int32, each counting
    the sequence's new tokens, whose K/V must already be written. k_cache, v_cache: (num_slots,
    num_kv_heads, head_dim); block_tables: (batch, max_blocks) int32. `max_query_len` bounds every
    sequence's new tokens on the host (rows past it are not computed). `scale` defaults to
    1/sqrt(head_dim); `window` keeps keys with pos - window < key_pos <= pos (sliding-window layers).
    `out` is (num_tokens, num_heads, head_dim) in q's dtype. Tile sizes default to GPU choices.
    """
    if q.dim() != 3 or k_cache.dim() != 3 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"q must be (num_tokens, heads, head_dim) and k/v caches (num_slots, kv_heads, head_dim) alike; "
            f"got q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}"
        )
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    if k_cache.shape[2] != head_dim or num_heads % num_kv_heads:
        raise ValueError(
            f"q has {num_heads} heads of dim {head_dim}; the cache has {num_kv_heads} KV heads of dim "
            f"{k_cache.shape[2]} (heads must be a multiple of KV heads, dims equal)"
        )
    batch = context_lens.shape[0] if context_lens.dim() == 1 else -1
    if batch < 0 or query_start.shape != (batch + 1,) or block_tables.dim() != 2:
        raise ValueError(
            f"context_lens must be (batch,), query_start (batch + 1,) and block_tables (batch, max_blocks); "
            f"got {tuple(context_lens.shape)}, {tuple(query_start.shape)} and {tuple(block_tables.shape)}"
        )
    if block_tables.shape[0] != batch:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows; context_lens has {batch} sequences")
    if any(t.dtype != torch.int32 for t in (block_tables, context_lens, query_start)):
        raise TypeError(
            f"block_tables, context_lens and query_start must be int32, got {block_tables.dtype}, "
            f"{context_lens.dtype}, {query_start.dtype}"
        )
    if not (q.is_floating_point() and k_cache.is_floating_point() and v_cache.dtype == k_cache.dtype):
        raise TypeError(
            f"q and the caches must be floating point, k and v alike; got {q.dtype}, {k_cache.dtype}"
        )
    if k_cache.stride(2) != 1 or v_cache.stride(2) != 1 or q.stride(2) != 1 or block_tables.stride(1) != 1:
        raise ValueError("q, k_cache, v_cache and block_tables need a contiguous last dim")
    if block_size < 1 or max_query_len < 0 or (window is not None and window < 1):
        raise ValueError(
            f"block_size and window must be >= 1 and max_query_len >= 0; got {block_size}, {window} "
            f"and {max_query_len}"
        )
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(
            f"out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim, "
            f"got {tuple(out.shape)} {out.dtype}"
        )
    d_pad = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs K >= 16; padding is masked
    tiles = _default_tiles(d_pad, k_cache.dtype == torch.float32)
    block_m = tiles[0] if block_m is None else block_m
    block_n = tiles[1] if block_n is None else block_n
    for name, size in (("block_m", block_m), ("block_n", block_n)):
        if size < 16 or size & (size - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's minimum), got {size}")
    if num_tokens == 0 or batch == 0 or max_query_len == 0:
        return out
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    # Triton's interpreter (3.9) computes bf16 tl.dot wrongly; there the dots run in fp32 instead.
    dot_f32 = k_cache.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    # fp32 dots stay fp32 (not tf32); 16-bit inputs take the default.
    precision = "ieee" if k_cache.dtype == torch.float32 or dot_f32 else None
    grid = (triton.cdiv(max_query_len * group, block_m), batch, num_kv_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, context_lens, query_start, out,
        scale * _LOG2E, window or 0, block_size,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        block_tables.stride(0), out.stride(0), out.stride(1),
        G=group, D=head_dim, D_PAD=d_pad, BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_WINDOW=window is not None, PRECISION=precision, DOT_F32=dot_f32,
        num_warps=num_warps or tiles[2], num_stages=num_stages or tiles[3],
    )  # fmt: skip
    return out
