"""Split-K paged decode attention against a float64 softmax over the same paged cache.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set before triton is
imported) at small sizes; with CUDA they run compiled, and long contexts (3,000 and 30,000) too.

The cache is filled with NaN before the context is written, at shuffled blocks, so a read outside
the context or a lost mask shows up as NaN; outputs are poisoned with NaN before the call.

Tolerance, per sequence, relative to that sequence's largest |output| (an average over a long context
of N(0, 1) values shrinks like 1/sqrt(context), and so does the error): fp32 1e-5 (the reference sums
in another order, in float64); fp16/bf16 4 * eps(dtype): the probabilities are rounded to the cache
dtype before P @ V, as in flash attention, then the output to its dtype.
"""

from __future__ import annotations

import functools
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.kernels.paged_attention import (  # noqa: E402
    choose_num_splits,
    default_launch,
    paged_decode_attention,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="long contexts run only on CUDA")


def make_case(context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    batch = len(context_lens)
    max_blocks = max(-(-n // block_size) for n in context_lens)
    num_blocks = batch * max_blocks + 3  # spare blocks stay NaN
    perm = torch.randperm(num_blocks, generator=g)[: batch * max_blocks].view(batch, max_blocks)
    shape = (num_blocks * block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    contexts = []
    for b, n in enumerate(context_lens):
        pos = torch.arange(n)
        slots = perm[b, pos // block_size] * block_size + pos % block_size
        k = torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype)
        v = torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype)
        k_cache[slots], v_cache[slots] = k, v
        contexts.append((k, v))
    q = torch.randn(batch, num_heads, head_dim, generator=g).to(dtype)
    return q, k_cache, v_cache, perm.to(torch.int32), torch.tensor(context_lens, dtype=torch.int32), contexts


def reference(q, contexts, scale, window):
    group = q.shape[1] // contexts[0][0].shape[1]
    outs = []
    for b, (k, v) in enumerate(contexts):
        k = k.double().repeat_interleave(group, 1)  # (n, heads, dim)
        v = v.double().repeat_interleave(group, 1)
        s = torch.einsum("hd,thd->ht", q[b].double(), k) * scale
        if window is not None:
            s[:, : max(0, k.shape[0] - window)] = float("-inf")
        outs.append(torch.einsum("ht,thd->hd", s.softmax(-1), v))
    return torch.stack(outs)


def check(
    context_lens,
    num_heads,
    num_kv_heads,
    head_dim,
    block_size,
    dtype,
    num_splits,
    window=None,
    min_split_len=1,
    block_t=64,
    **launch,
):
    # min_split_len=1: a split a tile (the floor): contexts past one tile exercise the merge.
    q, k_cache, v_cache, tables, lens, contexts = make_case(
        context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=len(context_lens) + head_dim
    )
    scale = head_dim**-0.5
    out = torch.full(q.shape, float("nan"), dtype=dtype, device=DEVICE)
    got = paged_decode_attention(
        q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), tables.to(DEVICE), lens.to(DEVICE),
        block_size=block_size, scale=scale, window=window, num_splits=num_splits, out=out,
        min_split_len=min_split_len, block_t=block_t, **launch,
    )  # fmt: skip
    assert got is out
    got = got.cpu().double()
    assert torch.isfinite(got).all(), "NaN/Inf in the output (the cache outside the context is NaN)"
    tol = 1e-5 if dtype == torch.float32 else 4 * torch.finfo(dtype).eps
    ref = reference(q, contexts, scale, window)
    rel = ((got - ref).abs().flatten(1).amax(1) / ref.abs().flatten(1).amax(1)).max().item()
    assert rel <= tol, f"relative error {rel:.3g} > {tol:.3g} ({dtype}, splits {num_splits}, window {window})"


@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_contexts_1_17_300(num_splits, dtype):
    # GQA with 2 query heads per KV head; 300 positions over 19 shuffled blocks of 16.
    check([1, 17, 300], 4, 2, 32, 16, dtype, num_splits)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_group_of_seven_odd_block_and_head_dim(num_splits):
    # Qwen2.5's 14 query heads over 2 KV heads; head_dim 24 pads to 32; blocks of 5 positions.
    check([17, 300, 2], 14, 2, 24, 5, torch.float16, num_splits)


@pytest.mark.parametrize("window", [1, 20, 200, 1000])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_sliding_window(window, num_splits):
    # Windows of 1 and 20 fit one tile (one split, no merge); 200 of the 300 positions take 3 merged.
    check([1, 17, 300], 4, 1, 16, 16, torch.float32, num_splits, window=window)


def test_adaptive_splits():
    check([1, 17, 300], 2, 2, 16, 16, torch.float32, None)
    assert choose_num_splits(1, 2, 300) == 2  # two splits of >= 256 positions
    assert choose_num_splits(1, 2, 30_000) == 64  # capped
    assert choose_num_splits(64, 8, 30_000) == 1  # the batch alone fills the SMs


@cuda_only
@pytest.mark.parametrize("num_splits", [None, 8, 32])
@pytest.mark.parametrize("context_lens", [[3000, 1, 17], [30_000, 300]])
def test_long_contexts_cuda(context_lens, num_splits):
    check(context_lens, 28, 4, 128, 16, torch.bfloat16, num_splits)
    check(context_lens, 14, 2, 64, 16, torch.float16, num_splits, window=4096)


@pytest.mark.parametrize("window", [None, 200])
def test_splits_a_context_does_not_fill_are_skipped(window):
    # 8 splits asked for (as a graph captured for long contexts does), at least 256 positions each:
    # contexts 1 and 17 take one (written by the split kernel, merge skipped), 300 two, 600 three;
    # within the window of 200 every context takes one.
    check([1, 17, 300, 600], 4, 2, 32, 16, torch.float32, 8, window=window, min_split_len=256)


def small_case(context_lens: list[int], seed: int) -> tuple[torch.Tensor, ...]:
    """q, the caches, block tables and context lengths on DEVICE, as paged_decode_attention takes them
    positionally: 4 query heads over 2 KV heads of 32, blocks of 16 positions, float32."""
    q, k, v, tables, lens, _ = make_case(context_lens, 4, 2, 32, 16, torch.float32, seed=seed)
    return tuple(t.to(DEVICE) for t in (q, k, v, tables, lens))


@pytest.mark.parametrize("min_split_len", [1, 256])
def test_one_filled_split_gives_the_one_split_output_bit_for_bit(min_split_len):
    # Contexts within one tile of 64: a split holds at least a tile, so with min_split_len 1 (as with
    # 256) the 7 other splits do not run and the merge is skipped: the one-split kernel's bits.
    args = small_case([1, 17, 64], seed=3)
    one = paged_decode_attention(*args, block_size=16, num_splits=1)
    assert torch.equal(
        paged_decode_attention(*args, block_size=16, num_splits=8, min_split_len=min_split_len), one
    )


def test_an_empty_split_among_the_filled_ones_gives_the_same_bits():
    # 321 positions in tiles of 64: 4 splits take whole-tile chunks of 128, the last of them empty
    # (merged with weight 0); 3 splits take the same chunks, none empty. (Both hold with or without
    # the floor of a tile a split: they pin the partition it must keep, not the work it skips.)
    run = functools.partial(paged_decode_attention, *small_case([321], seed=5), block_size=16, block_t=64)
    assert torch.equal(run(num_splits=4), run(num_splits=3))
    # A graph's 64 splits over 640 positions in tiles of 16 use one a tile: 40 chunks of 16, as 40
    # splits give them. (Compared at counts whose merges pad to the same 64 partials: on the GPU the
    # merge's sum over 64 padded partials rounds apart from one over 8.)
    run = functools.partial(paged_decode_attention, *small_case([640], seed=6), block_size=16, block_t=16)
    assert torch.equal(run(num_splits=64), run(num_splits=40))


def test_errors_name_the_problem():
    q, k, v, tables, lens, _ = make_case([5], 4, 2, 16, 4, torch.float32, seed=0)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        paged_decode_attention(q[:, :3], k, v, tables, lens, block_size=4)
    with pytest.raises(TypeError, match="int32"):
        paged_decode_attention(q, k, v, tables.long(), lens, block_size=4)
    with pytest.raises(ValueError, match="context_lens"):
        paged_decode_attention(q, k, v, tables, lens[:0], block_size=4)
    with pytest.raises(ValueError, match="min_split_len and split_len must be >= 1, got 4, None, 0 and 256"):
        paged_decode_attention(q, k, v, tables, lens, block_size=4, min_split_len=0)


@pytest.mark.parametrize("num_splits", [65, 100])
def test_more_splits_than_one_merge_tile(num_splits):
    # Past 64 splits the merge takes its partials in chunks of 64 (its max first, then the sums): with
    # 16-position tiles a 3,000-long context fills 94 of them, a 300-long one 19, a 17-long one 2.
    check([3000, 300, 17], 4, 2, 16, 16, torch.float32, num_splits, block_t=16)
    check([3000, 1], 4, 1, 16, 16, torch.float16, num_splits, window=1500, block_t=16)


def test_split_knobs():
    # One sequence of two KV heads: 64 splits at the default cap; with the cap at 256, 125 over 32,000
    # positions (256 each), and over 64,000 132 (two programs per SM) or 250 (four, then by length).
    assert choose_num_splits(1, 2, 32_000) == 64
    assert choose_num_splits(1, 2, 32_000, max_splits=256) == 125
    assert choose_num_splits(1, 2, 64_000, max_splits=256) == 132
    assert choose_num_splits(1, 2, 64_000, max_splits=256, programs_per_sm=4) == 250
    assert choose_num_splits(1, 2, 300, max_splits=256, programs_per_sm=4) == 2
    q = torch.zeros(1, 2, 16, device=DEVICE)
    cache = torch.zeros(16, 2, 16, device=DEVICE)
    tables, lens = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    tables, lens = tables.to(DEVICE), lens.to(DEVICE)
    with pytest.raises(ValueError, match="num_stages must be >= 1, got None, 0, 2 and "):
        paged_decode_attention(q, cache, cache, tables, lens, block_size=16, max_splits=0)
    for warps in (0, 3, -1):
        with pytest.raises(
            ValueError, match=f"merge_warps must be a power of two .Triton's warps., got {warps}"
        ):
            paged_decode_attention(q, cache, cache, tables, lens, block_size=16, merge_warps=warps)


@pytest.mark.parametrize(
    "block_t, num_warps, num_stages, merge_warps",
    [(16, 2, 1, None), (32, 8, 4, 1), (128, 4, None, 2), (128, 4, 2, None), (16, 4, 2, 1)],
)
def test_launch_configs(block_t, num_warps, num_stages, merge_warps):
    # The launch choices the long-context sweep tries (benchmarks/gpu_attention_graph.py): the same
    # result within the tolerance (block_t moves the online softmax's rescaling points).
    check([1, 17, 300], 14, 2, 32, 16, torch.bfloat16, 3, block_t=block_t, num_warps=num_warps,
          num_stages=num_stages, merge_warps=merge_warps)  # fmt: skip


def test_merge_warps_reach_the_merge_kernel(monkeypatch):
    # STRATA_MERGE_WARPS on the model path; here the argument: the merge kernel's launch takes it, the
    # split kernel keeps num_warps; without it both take num_warps.
    import strata.kernels.paged_attention as pa
    from tests.launch_recorder import LaunchRecorder

    merges = LaunchRecorder(pa._merge_kernel)
    monkeypatch.setattr(pa, "_merge_kernel", merges)
    args = small_case([300], seed=9)
    want = paged_decode_attention(*args, block_size=16, num_splits=4, block_t=16)
    got = paged_decode_attention(*args, block_size=16, num_splits=4, block_t=16, merge_warps=1)
    # Fewer warps sum the splits in another order: within 4 ulps of the output's largest value (on
    # the H100 an entry of 0.008 moved 1.6 of its own ulps, so a relative bound alone fails).
    scale = want.abs().max().item() * torch.finfo(torch.float32).eps
    torch.testing.assert_close(got, want, rtol=0, atol=4 * scale)
    assert [launch["num_warps"] for launch in merges.launches] == [4, 1]


def test_default_launch():
    h100 = 232_448  # bytes of opt-in shared memory a block
    assert default_launch(64, 2, h100) == default_launch(128, 2, h100) == (128, 2)
    assert default_launch(128, 4, h100) == default_launch(256, 2, h100) == (64, None)  # tiles too big
    assert default_launch(64, 2, 0) == (64, None)  # unknown (the CPU): the tile from before


@cuda_only
def test_default_launch_reads_this_gpus_shared_memory():
    from strata.kernels.paged_attention import _shared_memory

    shared = _shared_memory(torch.device("cuda", 0))
    assert shared >= 48 * 1024
    if torch.cuda.get_device_capability() >= (9, 0):  # Hopper: the long tile for 16-bit caches
        assert default_launch(128, 2, shared) == (128, 2)


def test_attention_launch_env(monkeypatch):
    from strata import env

    for name in ("STRATA_ATTN_BLOCK_T", "STRATA_ATTN_WARPS", "STRATA_ATTN_STAGES", "STRATA_SPLIT_LEN"):
        monkeypatch.delenv(name, raising=False)
    assert env.decode_attention_launch() == (0, 4, 0, 256)
    monkeypatch.setenv("STRATA_ATTN_BLOCK_T", "128")
    monkeypatch.setenv("STRATA_ATTN_STAGES", "2")
    monkeypatch.setenv("STRATA_SPLIT_LEN", "128")
    assert env.decode_attention_launch() == (128, 4, 2, 128)
    monkeypatch.setenv("STRATA_ATTN_WARPS", "0")
    with pytest.raises(ValueError, match="STRATA_ATTN_WARPS='0' must be an integer from 1 to 16; unset it"):
        env.decode_attention_launch()


def test_split_env(monkeypatch):
    from strata import env

    monkeypatch.delenv("STRATA_MAX_SPLITS", raising=False)
    monkeypatch.delenv("STRATA_SPLIT_PROGRAMS", raising=False)
    assert env.decode_splits() == (64, 2)
    monkeypatch.setenv("STRATA_MAX_SPLITS", "256")
    monkeypatch.setenv("STRATA_SPLIT_PROGRAMS", "4")
    assert env.decode_splits() == (256, 4)
    monkeypatch.setenv("STRATA_MAX_SPLITS", "0")
    with pytest.raises(ValueError, match="STRATA_MAX_SPLITS='0' must be an integer from 1 to 1024; unset it"):
        env.decode_splits()


@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("level,kernel_level", [("1", 1), ("tile", 2)])
def test_prefetch_kv_gives_the_same_bits(monkeypatch, window, level, kernel_level):
    # STRATA_ATTENTION_PREFETCH=1: each split computes its first tile's slots before the wait (in
    # the interpreter and without PDL 2 no prefetch is issued, but the slot arithmetic runs: it must
    # stay within the tables, for splits past the context too); tile: it loads that tile's K and V
    # (all but the new token's row, loaded after the wait) and runs its loop from the second tile.
    # Either way the outputs are the same bits. Chunks of one to several 16-position tiles.
    import strata.kernels.paged_attention as pa
    from tests.launch_recorder import LaunchRecorder

    recorder = LaunchRecorder(pa._split_kernel)
    monkeypatch.setattr(pa, "_split_kernel", recorder)
    args = small_case([1, 17, 130], seed=8)
    for num_splits in (8, 2):
        run = functools.partial(
            paged_decode_attention, *args, block_size=16, num_splits=num_splits, block_t=16, window=window
        )
        monkeypatch.setenv("STRATA_ATTENTION_PREFETCH", "0")
        plain = run()
        monkeypatch.setenv("STRATA_ATTENTION_PREFETCH", level)
        assert torch.equal(run(), plain)
    assert [launch["PREFETCH_KV"] for launch in recorder.launches] == [0, kernel_level] * 2


def test_prefetch_level_is_checked(monkeypatch):
    from strata import env

    monkeypatch.delenv("STRATA_ATTENTION_PREFETCH", raising=False)
    assert env.attention_prefetch() == 2  # tile, the default
    monkeypatch.setenv("STRATA_ATTENTION_PREFETCH", "2")
    message = "STRATA_ATTENTION_PREFETCH='2' must be 0, 1 or tile; unset it for tile"
    with pytest.raises(ValueError, match=message):
        env.attention_prefetch()
