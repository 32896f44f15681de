"""The rotary embedding and K/V-cache write in the q, k, v projections' matvec store
(STRATA_ROPE_IN_MATVEC, `kernels.kv_in_matvec`): the same bits as the matvec followed by
`rotary_kv_write`, in the output (q rotated, v as it is; k's columns are not written) and in every
cache slot (the rest left untouched), for each kernel that takes it (Q5_0's and Q8_0's fp32-x
and int8-x kernels, Q4_K's planar int8 kernel, Q6_K's rows kernel for v), both pair layouts, a linear RoPE
scale, split-K, several tokens and a padding token (negative slot); clear errors where it cannot go."""

from __future__ import annotations

import os
from dataclasses import replace

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.kernels.kv_in_matvec import KVWrite  # noqa: E402
from strata.kernels.quant_matvec import MatvecConfig, quant_matvec, writes_kv  # noqa: E402
from strata.kernels.quant_pack import pack_quant_weight  # noqa: E402
from strata.kernels.rotary_kv import rotary_kv_write  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, random_weight  # noqa: E402

SLOTS = 12


def case(qtype, heads, kv_heads, dim, k, m, dtype, parts="qkv", seed=0, layout=None, q6k_layout=None):
    """A projection of q's, k's and v's rows as `parts` names ("qkv", "qk", "v"), its packed weight and
    bias, x, positions, slots (the last token's -1 when m > 1: padding), NaN caches and inv_freq."""
    gen = torch.Generator().manual_seed(seed)
    rows = {"q": heads * dim, "k": kv_heads * dim, "v": kv_heads * dim}
    n = sum(rows[p] for p in parts)
    w = pack_quant_weight(random_weight(qtype, n, k, seed).to(DEVICE), qtype, n, k, layout, q6k_layout)
    bias = (torch.randn(n, generator=gen) * 0.1).to(DEVICE)
    x = torch.randn(m, k, generator=gen).to(dtype).to(DEVICE)
    positions = torch.randint(0, 4000, (m,), generator=gen).to(DEVICE)
    slots = torch.randperm(SLOTS, generator=gen)[:m].to(DEVICE)
    if m > 1:
        slots[-1] = -1
    caches = [torch.full((SLOTS, kv_heads, dim), float("nan"), dtype=dtype, device=DEVICE) for _ in range(2)]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    q_rows, k_rows = rows["q"] * ("q" in parts), rows["k"] * ("k" in parts)
    return w, bias, x, positions, slots, caches, inv_freq.to(DEVICE), q_rows, k_rows


def run_both(qtype, heads=2, kv_heads=1, dim=32, k=256, m=1, dtype=torch.bfloat16, parts="qkv",
             layout_pairs="neox", scale=1.0, config=None, cache_dtype=None, **pack):  # fmt: skip
    w, bias, x, positions, slots, caches, inv_freq, q_rows, k_rows = case(
        qtype, heads, kv_heads, dim, k, m, dtype, parts, **pack
    )
    if cache_dtype is not None:
        caches = [c.to(cache_dtype) for c in caches]
    n = w.n
    # the reference: the matvec, then the rotary kernel on its q and k columns, v copied to its cache
    want = quant_matvec(x, w, qtype, n, k, bias=bias, config=config)
    want_caches = [c.clone() for c in caches]
    q = want[:, :q_rows].view(m, -1, dim)
    kk = want[:, q_rows : q_rows + k_rows].view(m, -1, dim)
    v = want[:, q_rows + k_rows :].view(m, -1, dim)
    k_in = kk if k_rows else torch.zeros_like(v)
    v_in = v if n > q_rows + k_rows else torch.zeros_like(k_in)
    rotary_kv_write(
        q if q_rows else torch.zeros(m, 0, dim, dtype=dtype, device=DEVICE), k_in, v_in, positions, inv_freq,
        *want_caches, slots, rope_dim=dim, layout=layout_pairs, scale=scale,
    )  # fmt: skip
    if not k_rows:  # only v's rows: the rotary kernel wrote a zero K; the fused write leaves K alone
        want_caches[0] = caches[0].clone()
    if n == q_rows + k_rows:
        want_caches[1] = caches[1].clone()
    kv = KVWrite(positions, slots, inv_freq, *caches, layout_pairs, scale).part(q_rows, k_rows)
    got = quant_matvec(x, w, qtype, n, k, bias=bias, config=config, kv=kv)
    keep = torch.ones(n, dtype=torch.bool)
    keep[q_rows : q_rows + k_rows] = False  # k's columns: the cache holds them (rotated), not the output
    return got[:, keep], want[:, keep], caches, want_caches


def assert_same(got, want, caches, want_caches):
    assert torch.equal(got, want)
    for c, wc in zip(caches, want_caches, strict=True):
        assert torch.equal(c.isnan(), wc.isnan())  # exactly the slots written
        assert torch.equal(torch.nan_to_num(c.float()), torch.nan_to_num(wc.float()))


@pytest.mark.parametrize("layout_pairs", ["neox", "interleaved"])
@pytest.mark.parametrize("qtype", [T.Q5_0, T.Q8_0])
def test_fp32_x_kernels_match_matvec_then_rotary(qtype, layout_pairs, monkeypatch):
    monkeypatch.setenv("STRATA_INT8_X", "Q4_K+Q6_K")  # 16-bit x (int8 by default: test_legacy_int8_kernels)
    assert_same(*run_both(qtype, layout_pairs=layout_pairs))


@pytest.mark.parametrize(
    "m,dtype,parts,scale",
    [(3, torch.float16, "qkv", 1.0), (1, torch.float32, "qk", 4.0), (2, torch.bfloat16, "v", 1.0)],
)
def test_q5_0_tokens_parts_and_scale(m, dtype, parts, scale):
    # several tokens (the last one padding), q+k beside a v of its own, a v alone, a RoPE scale
    assert_same(*run_both(T.Q5_0, m=m, dtype=dtype, parts=parts, scale=scale))


def test_split_k_and_a_wider_head():
    # the last split's store rotates; 64-channel heads in tiles of 8 rows (pairs 32 apart)
    config = MatvecConfig(8, 64, split_k=2)
    assert_same(*run_both(T.Q8_0, heads=2, kv_heads=2, dim=64, config=config, cache_dtype=torch.float16))


@pytest.mark.parametrize("parts,m", [("qkv", 2), ("qk", 1)])
def test_q4_k_planar_int8(parts, m):
    # one row: the flat accumulator's tile of 8 rows; two: tiles of 16
    assert_same(*run_both(T.Q4_K, parts=parts, m=m, layout="planar"))


LEGACY_INT8 = MatvecConfig(8, 256, 1, int8_x=True)
PRELOADED = MatvecConfig(8, 256, 1, int8_x=True, matched_loads=True, preload=True)  # the decode tile's kind
LANES = replace(PRELOADED, lane_blocks=True)  # STRATA_INT8_LANE_BLOCKS


@pytest.mark.parametrize(
    "qtype,m,parts,config",
    [(T.Q5_0, 1, "qkv", PRELOADED), (T.Q8_0, 1, "qk", PRELOADED), (T.Q8_0, 2, "qk", LEGACY_INT8),
     (T.Q5_0, 3, "v", LEGACY_INT8), (T.Q5_0, 1, "qkv", LANES),
     (T.Q8_0, 1, "v", replace(LANES, preload=False)),
     (T.Q5_0, 3, "qkv", replace(LEGACY_INT8, lane_blocks=True))],
)  # fmt: skip
def test_legacy_int8_kernels(qtype, m, parts, config):
    # Q5_0 and Q8_0 on int8 x (STRATA_INT8_X's default): the dp4a kernel's store rotates and writes,
    # after the plain loop and after the preloaded matched step (a half block a lane, and a whole one)
    w = pack_quant_weight(random_weight(qtype, 96, 256, 0).to(DEVICE), qtype, 96, 256)
    assert writes_kv(w, torch.bfloat16, True, 32)
    assert_same(*run_both(qtype, m=m, parts=parts, config=config))


def test_q6_k_rows_takes_v_only():
    w = pack_quant_weight(random_weight(T.Q6_K, 64, 256, 0).to(DEVICE), T.Q6_K, 64, 256, q6k_layout="rows")
    assert writes_kv(w, torch.bfloat16, False, 32) and not writes_kv(w, torch.bfloat16, True, 32)
    assert_same(*run_both(T.Q6_K, heads=2, kv_heads=2, parts="v", q6k_layout="rows"))


def test_where_it_cannot_go():
    w, bias, x, positions, slots, caches, inv_freq, q_rows, k_rows = case(
        T.Q5_0, 2, 1, 32, 256, 1, torch.bfloat16
    )
    kv = KVWrite(positions, slots, inv_freq, *caches, "neox").part(q_rows, k_rows)
    with pytest.raises(ValueError, match="row tiles that divide head_dim"):
        quant_matvec(x, w, T.Q5_0, w.n, 256, kv=kv, config=MatvecConfig(64, 256))
    with pytest.raises(ValueError, match="whole heads"):
        quant_matvec(x, w, T.Q5_0, w.n, 256, kv=kv.part(q_rows + 8, k_rows))
    with pytest.raises(ValueError, match="contiguous"):
        strided = torch.full((SLOTS, 1, 64), float("nan"), dtype=x.dtype, device=DEVICE)[..., ::2]
        quant_matvec(x, w, T.Q5_0, w.n, 256, kv=KVWrite(positions, slots, inv_freq, strided, caches[1],
                                                         "neox").part(q_rows, k_rows))  # fmt: skip
    q4 = pack_quant_weight(random_weight(T.Q4_K, 64, 256, 0).to(DEVICE), T.Q4_K, 64, 256, "blocks")
    assert not writes_kv(q4, torch.bfloat16, False, 32)
    with pytest.raises(ValueError, match="no K/V write in the matvec of Q4_K"):
        quant_matvec(
            x, q4, T.Q4_K, 64, 256, kv=KVWrite(positions, slots, inv_freq, *caches, "neox").part(0, 32)
        )
    assert not writes_kv(w, torch.bfloat16, True, 40)  # heads of 40: the default tiles split pairs
    assert torch.isnan(caches[0]).all() and torch.isnan(caches[1]).all()  # nothing written on the way


@pytest.mark.parametrize("v_type,layout", [(T.Q5_0, "neox"), (T.Q8_0, "neox"), (T.Q8_0, "interleaved")])
def test_the_layers_write_what_the_rotary_kernel_writes(monkeypatch, v_type, layout):
    # Attention over the output of q, k, v projections (a stacked Q5_0 q+k+v, or q+k beside a Q8_0 v)
    # for two decode rows: with the setting, the projections rotate and write K/V (`Attention.kv_write`)
    # and the attention output and both caches equal those of the rotary kernel's launch; without it,
    # or past STRATA_MATVEC_ROWS rows, no write is asked of the projections.
    from types import SimpleNamespace

    from strata.layers.attention import Attention
    from strata.layers.linear import Projections, QuantLinear
    from strata.layers.placement import Placement
    from strata.layers.rotary import RotaryEmbedding
    from tests.test_kernels_paged_attention import make_case

    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    sizes = {"attn_q": (T.Q5_0, 128), "attn_k": (T.Q5_0, 64), "attn_v": (v_type, 64)}
    layers = {
        name: QuantLinear(
            random_weight(qtype, n, 256, seed=n).to(DEVICE),
            qtype,
            (n, 256),
            place,
            (torch.randn(n) * 0.1).to(DEVICE),
        )  # fmt: skip
        for name, (qtype, n) in sizes.items()
    }
    projections = Projections(layers, place)
    _, k_cache, v_cache, tables, lens, _ = make_case([40, 7], 4, 2, 32, 16, torch.bfloat16, seed=3)
    pos = (lens - 1).long()
    meta = SimpleNamespace(
        paged=SimpleNamespace(
            block_tables=tables.to(DEVICE), context_lens=lens.to(DEVICE), block_size=16, num_splits=2,
            max_context_len=48, max_splits=0, block_t=16, num_stages=0,
        ),
        positions=pos.to(DEVICE),
        slot_mapping=(tables[torch.arange(2), pos // 16].long() * 16 + pos % 16).to(DEVICE),
        paged_prefill=None,
    )  # fmt: skip
    h = torch.randn(2, 256).to(torch.bfloat16).to(DEVICE)

    def step(
        setting: str, rows: str = "4", rope_dim: int = 32
    ) -> tuple[torch.Tensor, list[torch.Tensor], bool]:
        monkeypatch.setenv("STRATA_ROPE_IN_MATVEC", setting)
        monkeypatch.setenv("STRATA_MATVEC_ROWS", rows)
        caches = [k_cache.clone().to(DEVICE), v_cache.clone().to(DEVICE)]
        kv = SimpleNamespace(layer=lambda i: caches)
        rotary = RotaryEmbedding(rope_dim, 10000.0, layout).to(DEVICE)
        attn = Attention(0, 4, 2, 32**-0.5, None, rotary, fused=True)
        projections.matvec_rows = int(rows)
        for part in projections.parts.values():
            part.matvec_rows = int(rows)
        write = attn.kv_write(h, projections, kv, meta)  # type: ignore[arg-type]
        q, k, v = (t.view(2, -1, 32) for t in projections(h, kv=write))
        out = attn(q, k, v, kv, meta, written=write is not None)  # type: ignore[arg-type]
        return out, caches, write is not None

    want, want_caches, asked = step("0")
    assert not asked
    out, caches, asked = step("1")
    assert asked
    assert torch.equal(out, want)
    for c, wc in zip(caches, want_caches, strict=True):
        assert torch.equal(c.isnan(), wc.isnan()) and torch.equal(c.nan_to_num(), wc.nan_to_num())
    assert not step("1", rows="1")[2]  # two rows: the projections take the matmul, the rotary kernel runs
    assert not step("1", rope_dim=16)[2]  # partial rotary: the rotary kernel


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the real vocabulary's head is slow in the interpreter"
)
@pytest.mark.parametrize("layout", ["qwen2.5-0.5b-tiny", "qwen2.5-1.5b-tiny"])
def test_gpu_model_keeps_the_tokens_without_the_rotary_launches(monkeypatch, tmp_path, layout):
    # The 0.5B's tiny layout (Q5_0 q+k, Q5_0 or Q8_0 v) and the 1.5B's (Q4_K planar q+k on int8 x,
    # Q6_K rows or Q4_K v) in bf16 in CUDA graphs: with the setting no decode step launches the rotary
    # kernel (prefill still does), and the greedy ids are the same.
    import strata.kernels.rotary_kv as rotary_kv
    from tests.launch_recorder import LaunchRecorder
    from tests.test_model_kernel_path import greedy_ids, tiny

    path = tiny(tmp_path, layout)
    recorder = LaunchRecorder(rotary_kv._rotary_kv_kernel)
    monkeypatch.setattr(rotary_kv, "_rotary_kv_kernel", recorder)

    def run() -> tuple[list[list[int]], int]:
        recorder.launches.clear()
        ids = greedy_ids(path, DEVICE, kernels=True, num_tokens=16, dtype=torch.bfloat16)
        return ids, len(recorder.launches)

    monkeypatch.setenv("STRATA_ROPE_IN_MATVEC", "0")
    want, without = run()
    monkeypatch.setenv("STRATA_ROPE_IN_MATVEC", "1")
    ids, launched = run()
    assert ids == want
    assert 0 < launched < without, (without, launched)
