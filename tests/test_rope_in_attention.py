"""STRATA_ROPE_IN_ATTENTION: the paged decode attention kernel rotates q and writes the new token's
rotated K and its V itself (`new_kv`), instead of `rotary_kv_write` launching first.

Held to the two launches it replaces: the output, both caches (every slot, NaN where nothing was
written) and q (left unrotated). The rotation is the same fp32 arithmetic in the same order
(`rotary_kv.rope_rotate`), so in the interpreter, and compiled for 16-bit values, equality is
exact. Compiled in fp32 it is not: Triton contracts the rotation's multiplies and adds into FMAs per
kernel, and the two kernels' contractions can round a rotated K an ulp apart (H100, 2026-12-06: 4
to 26 of 30-60k cache values, by 1.2e-7 to 2.4e-7), so fp32 on CUDA is held to 1e-6.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from strata.kernels.paged_attention import paged_decode_attention  # noqa: E402
from strata.kernels.rotary_kv import NewKV, rotary_kv_write  # noqa: E402
from strata.layers.rotary import RotaryEmbedding  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAN = float("nan")


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    tol = 1e-6 if DEVICE == "cuda" and got.dtype == torch.float32 else 0.0  # see the module's docstring
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def run_both(
    context_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    rope_dim: int | None = None,
    layout: str = "neox",
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype | None = None,
    block_size: int = 16,
    num_splits: int = 3,
    min_split_len: int = 1,
    window: int | None = None,
    pad_rows: tuple[int, ...] = (),
    seed: int = 0,
) -> None:
    """Both ways on the same inputs. The context's earlier positions are in the cache at shuffled
    blocks, the new one's slot (and every spare slot) NaN; rows in `pad_rows` have slot -1."""
    g = torch.Generator().manual_seed(seed)
    cache_dtype = cache_dtype or dtype
    rope_dim = rope_dim or head_dim
    batch = len(context_lens)
    max_blocks = max(-(-n // block_size) for n in context_lens)
    num_blocks = batch * max_blocks + 2
    tables = torch.randperm(num_blocks, generator=g)[: batch * max_blocks].view(batch, max_blocks)
    k_cache = torch.full((num_blocks * block_size, num_kv_heads, head_dim), NAN, dtype=cache_dtype)
    v_cache = k_cache.clone()
    new_slots = []
    for b, n in enumerate(context_lens):
        pos = torch.arange(n)
        slots = tables[b, pos // block_size] * block_size + pos % block_size
        k_cache[slots[:-1]] = torch.randn(n - 1, num_kv_heads, head_dim, generator=g).to(cache_dtype)
        v_cache[slots[:-1]] = torch.randn(n - 1, num_kv_heads, head_dim, generator=g).to(cache_dtype)
        new_slots.append(-1 if b in pad_rows else slots[-1].item())
    # q, k, v as views of one fused QKV output, as the model hands them over.
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(batch, width, generator=g).to(dtype).to(DEVICE)
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=1)
    q, k, v = (t.view(batch, -1, head_dim) for t in (q, k, v))
    # Large positions: angles far outside [-pi, pi] (the position is context_len - 1 in the engine; the
    # kernel takes the one given).
    positions = torch.tensor([n - 1 + 7_000 * b for b, n in enumerate(context_lens)], device=DEVICE)
    slot_mapping = torch.tensor(new_slots, device=DEVICE)
    rope = RotaryEmbedding(rope_dim, 10000.0, layout, 1.5)
    inv_freq = rope.inv_freq.to(DEVICE)
    attn = dict(
        block_tables=tables.to(torch.int32).to(DEVICE),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=DEVICE),
        block_size=block_size, window=window, num_splits=num_splits, min_split_len=min_split_len,
    )  # fmt: skip

    q_ref, kc_ref, vc_ref = q.clone(), k_cache.to(DEVICE, copy=True), v_cache.to(DEVICE, copy=True)
    rotary_kv_write(
        q_ref, k, v, positions, inv_freq, kc_ref, vc_ref, slot_mapping,
        rope_dim=rope_dim, layout=layout, scale=1.5,
    )  # fmt: skip
    want = paged_decode_attention(q_ref, kc_ref, vc_ref, **attn)

    q_in, kc, vc = q.clone(), k_cache.to(DEVICE, copy=True), v_cache.to(DEVICE, copy=True)
    new_kv = NewKV(k, v, positions, slot_mapping, inv_freq, rope_dim, layout, 1.5)
    got = paged_decode_attention(q_in, kc, vc, new_kv=new_kv, **attn)

    assert_same(kc, kc_ref, "k cache")
    assert_same(vc, vc_ref, "v cache")
    assert_same(q_in, q, "q (not rotated in place)")
    real = [b for b in range(batch) if b not in pad_rows]
    assert torch.isfinite(got[real]).all(), "the new position was read before it was written"
    assert_same(got, want, "output")


@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_contexts_1_17_300(num_splits, dtype):
    # With 8 splits (one tile of 64 each at most) the new position of the 17-long context is in the
    # first split, its only one, the 300-long one's in the fifth; with 1 in the only one.
    run_both([1, 17, 300], 4, 2, 32, dtype=dtype, num_splits=num_splits, seed=num_splits)


@pytest.mark.parametrize("layout", ["neox", "interleaved"])
def test_partial_rotary_and_group_of_seven(layout):
    # Qwen2.5's 14 heads over 2 KV heads; head_dim 24 (pads to 32) with 16 channels rotated; a bf16
    # model over an fp16 cache (K rounded to bf16 then fp16, as the rotary kernel rounds it).
    run_both(
        [17, 300, 2], 14, 2, 24, rope_dim=16, layout=layout, dtype=torch.bfloat16,
        cache_dtype=torch.float16, block_size=5, num_splits=3,
    )  # fmt: skip


@pytest.mark.parametrize("min_split_len", [1, 256])
def test_live_splits_and_window(min_split_len):
    # The window's first position moves the chunks; the new position is always inside it.
    run_both([1, 40, 600], 4, 1, 16, num_splits=8, min_split_len=min_split_len, window=37)


@pytest.mark.parametrize("prefetch", ["0", "tile"])
@pytest.mark.parametrize("num_splits", [8, 2])
def test_first_tile_preloaded_or_not(monkeypatch, num_splits, prefetch):
    # STRATA_ATTENTION_PREFETCH=tile (the default, under which the other tests here run): each split
    # loads its first tile's K and V before the wait, all but the new token's row, whose slot holds NaN
    # until the split itself writes it; 0 loads every tile in the loop. In tiles of 64, with 8 splits
    # the new positions (0, 16, 64, 299) are all in a split's first tile; with 2 the 300-long
    # context's is in its second split's second tile, the 65-long one's in its second split's first.
    monkeypatch.setenv("STRATA_ATTENTION_PREFETCH", prefetch)
    run_both([1, 17, 65, 300], 4, 2, 32, num_splits=num_splits, seed=num_splits)


def test_padding_row_writes_nothing():
    # Slot -1: neither way writes, both read the NaN never written (so that row's output is NaN in both).
    run_both([5, 9, 3], 2, 2, 16, pad_rows=(1,), num_splits=2)


def test_rejects_mismatched_inputs():
    q = torch.zeros(2, 4, 16, device=DEVICE)
    cache = torch.zeros(32, 2, 16, device=DEVICE)
    k = torch.zeros(2, 2, 16, device=DEVICE)
    ints = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    inv = torch.ones(8, device=DEVICE)
    tables, lens = torch.zeros(2, 2, dtype=torch.int32, device=DEVICE), torch.ones(2, dtype=torch.int32)
    kwargs = dict(block_size=16, num_splits=1)
    with pytest.raises(ValueError, match=r"rope_dim must be even and in \[2, head_dim=16\], got 18"):
        bad = NewKV(k, k, ints, ints, inv, 18, "neox")
        paged_decode_attention(q, cache, cache, tables, lens.to(DEVICE), new_kv=bad, **kwargs)
    with pytest.raises(ValueError, match=r"positions must be \(2\); got \(3,\)"):
        bad = NewKV(k, k, ints.new_zeros(3), ints, inv, 16, "neox")
        paged_decode_attention(q, cache, cache, tables, lens.to(DEVICE), new_kv=bad, **kwargs)
    with pytest.raises(ValueError, match="new_kv's k and v need a contiguous last dim"):
        strided = torch.zeros(2, 2, 32, device=DEVICE)[:, :, ::2]
        bad = NewKV(strided, k, ints, ints, inv, 16, "neox")
        paged_decode_attention(q, cache, cache, tables, lens.to(DEVICE), new_kv=bad, **kwargs)
