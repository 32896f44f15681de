"""Paged prefill attention against a float64 softmax over the same paged cache.

Without CUDA the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set before triton is
imported) at small sizes and small tiles; with CUDA it runs compiled at its default tiles, and a
3,000-position context with 2,048 new tokens too.

The cache is filled with NaN before the contexts are written, at shuffled blocks through a block
table that is a column slice of a wider one, so a read outside a context or a lost mask shows up as
NaN; q is a column view of a fused QKV output; outputs are poisoned with NaN, so every element must be
written.

Tolerance, per (token, head) row, relative to that row's largest |output| (an average over n keys of
N(0, 1) values shrinks like 1/sqrt(n), and so does the error): fp32 1e-5 (the reference sums in another
order, in float64); fp16/bf16 4 * eps(dtype): the probabilities are rounded to the cache dtype before
P @ V, as in flash attention, then the output to its dtype, each costing up to eps/2 of the row.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.kernels.paged_prefill_attention import paged_prefill_attention  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="long contexts run only on CUDA")
# The interpreter runs every tile op in numpy; small tiles still give several row and key tiles here.
TILES = {} if torch.cuda.is_available() else {"block_m": 32, "block_n": 16}


def make_case(prefix_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    batch = len(prefix_lens)
    context_lens = [p + n for p, n in zip(prefix_lens, query_lens, strict=True)]
    max_blocks = max(-(-n // block_size) for n in context_lens)
    num_blocks = batch * max_blocks + 3  # spare blocks stay NaN
    perm = torch.randperm(num_blocks, generator=g)
    # A column slice of a wider table (rows not contiguous); unused entries name a NaN block.
    wide = torch.full((batch, max_blocks + 2), int(perm[-1]), dtype=torch.int32)
    wide[:, :max_blocks] = perm[: batch * max_blocks].view(batch, max_blocks)
    tables = wide[:, :max_blocks]
    shape = (num_blocks * block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    contexts = []
    for b, n in enumerate(context_lens):
        pos = torch.arange(n)
        slots = tables[b, pos // block_size].long() * block_size + pos % block_size
        k_cache[slots] = torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype)
        v_cache[slots] = torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype)
        contexts.append(slots)
    num_tokens = sum(query_lens)
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=g).to(dtype)
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)  # row stride > heads * dim
    query_start = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return q, k_cache, v_cache, tables, lens, query_start, contexts


def reference(q, k_cache, v_cache, query_start, contexts, scale, window):
    """Per sequence: gather K/V by slot, mask causal (and window), softmax in float64 (on DEVICE: the
    long CUDA case's scores are 1.4 GB)."""
    group = q.shape[1] // k_cache.shape[1]
    outs = []
    for b, slots in enumerate(contexts):
        rows = slice(int(query_start[b]), int(query_start[b + 1]))
        k = k_cache[slots].to(DEVICE).double().repeat_interleave(group, 1)  # (context_len, heads, dim)
        v = v_cache[slots].to(DEVICE).double().repeat_interleave(group, 1)
        n = rows.stop - rows.start
        q_pos = torch.arange(len(slots) - n, len(slots), device=DEVICE)
        delta = q_pos[:, None] - torch.arange(len(slots), device=DEVICE)[None, :]  # (query_len, context_len)
        allowed = delta >= 0
        if window is not None:
            allowed &= delta < window
        s = torch.einsum("thd,khd->htk", q[rows].to(DEVICE).double(), k) * scale
        s = s.masked_fill(~allowed, float("-inf"))
        outs.append(torch.einsum("htk,khd->thd", s.softmax(-1), v))
    return torch.cat(outs).cpu()


def check(prefix_lens, query_lens, heads, head_dim, block_size, dtype, window=None, tiles=None, slack=0):
    """heads: (num_heads, num_kv_heads); slack loosens max_query_len."""
    q, k_cache, v_cache, tables, lens, query_start, contexts = make_case(
        prefix_lens, query_lens, *heads, head_dim, block_size, dtype, seed=head_dim + block_size
    )
    out = torch.full(q.shape, float("nan"), dtype=dtype, device=DEVICE)
    got = paged_prefill_attention(
        q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), tables.to(DEVICE), lens.to(DEVICE),
        query_start.to(DEVICE), block_size=block_size, max_query_len=max(query_lens) + slack,
        window=window, out=out, **(TILES if tiles is None else tiles),
    )  # fmt: skip
    assert got is out
    got = got.cpu().double()
    assert torch.isfinite(got).all(), "NaN/Inf in the output (unwritten, or the cache outside a context)"
    tol = 1e-5 if dtype == torch.float32 else 4 * torch.finfo(dtype).eps
    ref = reference(q, k_cache, v_cache, query_start, contexts, head_dim**-0.5, window)  # the default scale
    rel = ((got - ref).abs().amax(-1) / ref.abs().amax(-1)).max().item()
    assert rel <= tol, f"relative error {rel:.3g} > {tol:.3g} ({dtype}, window {window})"


# Prefixes 0, 5 and 37 with 1, 17 and 33 new tokens: a whole prompt, a chunk after a cached prefix
# that starts mid-block, and a one-token query; 33 tokens x 7 heads span 8 row tiles of 32.
PREFIX, NEW = [0, 5, 37], [1, 17, 33]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("window", [None, 8])
@pytest.mark.parametrize("head_dim", [64, 80])  # 80 pads to 128
@pytest.mark.parametrize("heads", [(7, 1), (1, 1)], ids=["gqa7", "mha"])
@pytest.mark.parametrize("block_size", [16, 1])  # blocks of one position scatter every key
def test_ragged_chunks(block_size, heads, head_dim, window, dtype):
    check(PREFIX, NEW, heads, head_dim, block_size, dtype, window)


def test_two_kv_heads():
    # Qwen2.5-1.5B's 12:2 grouping: query head h must read KV head h // 6, not h % 2.
    check(PREFIX, NEW, (12, 2), 80, 16, torch.float16, window=8)


@pytest.mark.parametrize("window", [None, 3])
def test_one_row_tile_per_sequence(window):
    # block_m 64 with 1:1 heads: one row tile holds a whole chunk, so its keys span both sides of the
    # diagonal and, with window 3, its later rows see nothing in the first key tile. max_query_len is
    # a loose bound: the extra row tiles must return without writing.
    check(PREFIX, NEW, (1, 1), 64, 16, torch.float32, window, tiles={"block_m": 64, "block_n": 16}, slack=40)


def test_key_tile_wider_than_contexts():
    check(PREFIX, NEW, (4, 2), 32, 16, torch.float16, window=None, tiles={"block_m": 16, "block_n": 128})


def test_tokens_past_the_batch_are_untouched():
    # A CUDA-graph batch pads num_tokens; rows past query_start[batch] must keep what out held.
    q, k, v, tables, lens, qs, _ = make_case([5], [3], 2, 1, 16, 4, torch.float32, seed=0)
    q = torch.cat([q, q[:2]]).to(DEVICE)
    out = torch.full(q.shape, float("nan"), device=DEVICE)
    paged_prefill_attention(
        q, k.to(DEVICE), v.to(DEVICE), tables.to(DEVICE), lens.to(DEVICE), qs.to(DEVICE),
        block_size=4, max_query_len=3, out=out, **TILES,
    )  # fmt: skip
    assert torch.isfinite(out[:3]).all() and out[3:].isnan().all()


@cuda_only
@pytest.mark.parametrize("window", [None, 1024])
def test_long_chunk_cuda(window):
    check([952, 0], [2048, 300], (28, 4), 128, 16, torch.bfloat16, window)
    check([952, 0], [2048, 300], (8, 1), 256, 16, torch.float16, window)
    check([952, 0], [2048, 300], (14, 2), 64, 16, torch.float16, window)


def test_errors_name_the_problem():
    q, k, v, tables, lens, qs, _ = make_case([3], [2], 4, 2, 16, 4, torch.float32, seed=0)
    kw = {"block_size": 4, "max_query_len": 2}
    with pytest.raises(ValueError, match="multiple of KV heads"):
        paged_prefill_attention(q[:, :3], k, v, tables, lens, qs, **kw)
    with pytest.raises(TypeError, match="int32"):
        paged_prefill_attention(q, k, v, tables, lens, qs.long(), **kw)
    with pytest.raises(ValueError, match="query_start"):
        paged_prefill_attention(q, k, v, tables, lens, qs[:1], **kw)
    with pytest.raises(ValueError, match="block_n"):
        paged_prefill_attention(q, k, v, tables, lens, qs, block_n=24, **kw)
    with pytest.raises(ValueError, match="out must be"):
        paged_prefill_attention(q, k, v, tables, lens, qs, out=q.half(), **kw)
