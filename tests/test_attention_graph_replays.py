"""Decode attention in a captured CUDA graph, launched as the decode steps launch it (under PDL on an
sm_90 GPU): `rotary_kv_write` writes the step's new K/V, then `paged_decode_attention` reads the
context with it, at each STRATA_ATTENTION_PREFETCH level. Every replay gets a fresh q and new K/V at
the same slots, so a split that read the new token's row before the write became visible (the tile
level loads the rest of its first tile before the wait) would give the previous replay's values.
Held bit for bit to the same two calls run eagerly (no PDL) on copies of the caches. GPU only: the
interpreter runs programs one after another and has no graphs.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and PDL need a GPU")


@pytest.mark.parametrize("prefetch", ["0", "1", "tile"])
def test_graph_replays_read_each_new_row(monkeypatch, prefetch):
    from strata.kernels.paged_attention import paged_decode_attention
    from strata.kernels.rotary_kv import rotary_kv_write
    from strata.layers.rotary import RotaryEmbedding
    from tests.test_kernels_paged_attention import make_case

    monkeypatch.setenv("STRATA_ATTENTION_PREFETCH", prefetch)
    # The 0.5B's heads (14 over 2 KV heads of 64), bf16; new positions in a first tile (17, 64) and
    # past it (300), over 16 splits of 64-position tiles as the short graphs launch them.
    q0, k_cache, v_cache, tables, lens, _ = make_case([300, 17, 64], 14, 2, 64, 16, torch.bfloat16, seed=3)
    dev = torch.device("cuda")
    k_cache, v_cache, tables, lens = (t.to(dev) for t in (k_cache, v_cache, tables, lens))
    batch = lens.shape[0]
    last = (lens - 1).long()
    slots = tables.long().gather(1, (last // 16)[:, None])[:, 0] * 16 + last % 16
    positions = last.clone()
    inv_freq = RotaryEmbedding(64, 10000.0, "neox", 1.0).inv_freq.to(dev)
    q = torch.empty(batch, 14, 64, dtype=torch.bfloat16, device=dev)
    k_new = torch.empty(batch, 2, 64, dtype=torch.bfloat16, device=dev)
    v_new = torch.empty_like(k_new)
    out = torch.empty_like(q)

    def step(q, k_cache, v_cache, out):
        rotary_kv_write(
            q, k_new, v_new, positions, inv_freq, k_cache, v_cache, slots, rope_dim=64, layout="neox"
        )
        paged_decode_attention(
            q, k_cache, v_cache, tables, lens, block_size=16, out=out, num_splits=16, block_t=64, num_stages=2
        )

    g = torch.Generator(device=dev).manual_seed(0)

    def fresh() -> None:
        for t in (q, k_new, v_new):
            t.copy_(torch.randn(t.shape, generator=g, device=dev).to(t.dtype))

    fresh()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles) outside the capture
        step(q.clone(), k_cache.clone(), v_cache.clone(), torch.empty_like(out))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(q, k_cache, v_cache, out)
    for _ in range(4):
        fresh()
        q_ref, kc_ref, vc_ref, want = q.clone(), k_cache.clone(), v_cache.clone(), torch.empty_like(out)
        step(q_ref, kc_ref, vc_ref, want)
        graph.replay()
        torch.cuda.synchronize()
        for cache, ref in ((k_cache, kc_ref), (v_cache, vc_ref)):  # make_case's spare blocks hold NaN
            torch.testing.assert_close(cache, ref, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(out, want), "a replay's attention differs from the eager run on the same inputs"
