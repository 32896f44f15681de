"""`strata synth`: random-weight GGUFs in the exact layout of real models.

The real default model (and the 1.5B when assembled) is the reference for names, shapes, types and
tokenizer metadata; the 7B and MoE layouts are checked against their published numbers without
writing multi-GB files.
"""

from __future__ import annotations

import collections
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from strata.cli import main
from strata.engine.kv_cache import AttentionMetadata, KVCache
from strata.engine.llm import LLM, ModelConfig
from strata.gguf.reader import GGUFError, GGUFFile
from strata.gguf.spec import ModelSpec, spec_from_metadata
from strata.model_store import DEFAULT_MODEL, PACKAGED_MODELS, ModelNotAvailable, models_dir, resolve_model
from strata.prompt.loading import load_prompt_side
from strata.quant import dequantize
from strata.synth import BUILTIN_LAYOUTS, LayoutError, load_layout, plan_tensors, write_layout
from strata.synth.blocks import SUPPORTED_TYPES, random_data
from strata.synth.layouts import Layout, layout_from_json
from strata.synth.tokenizer_meta import TOKENIZER_FILE, load_tokenizer_metadata
from strata.synth.writer import layout_metadata

_T = GGMLQuantizationType
TINY_DENSE = ["qwen2.5-0.5b-tiny", "qwen2.5-1.5b-tiny", "qwen2.5-7b-tiny"]
# The layers whose attn_v and ffn_down get more bits in a 28-layer Q4_K_M file: use_more_bits over the
# file's string order of layers (blk.0, blk.1, blk.10, ...), exactly as in the real 1.5B file.
MORE_BITS_28 = {0, 1, 5, 6, 7, 8, 9, 10, 13, 16, 19, 21, 24, 27}


@pytest.fixture(scope="module")
def real_path() -> Path:
    try:
        return resolve_model(DEFAULT_MODEL, progress=False)
    except ModelNotAvailable as e:
        pytest.skip(f"the real default model is not available: {e}")


def test_synth_0_5b_matches_the_real_default_model(
    tmp_path: Path, real_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "qwen2.5-0.5b.gguf"
    assert main(["synth", "qwen2.5-0.5b", str(out), "--seed", "3"]) == 0
    print(capsys.readouterr().out.strip().splitlines()[-1])  # the speed line
    reader = GGUFReader(str(out))  # the gguf package's own reader: an independent parse of the file
    listed = [(t.name, [int(n) for n in t.shape], t.tensor_type.name) for t in reader.tensors]
    real = GGUFFile(real_path)
    assert listed == [(t.name, list(reversed(t.shape)), t.qtype.name) for t in real.tensors.values()]
    ours = GGUFFile(out)
    assert ModelSpec.from_gguf(ours) == ModelSpec.from_gguf(real)
    tokenizer_keys = [k for k in real.metadata if k.startswith("tokenizer.")]
    assert {k: ours.metadata[k] for k in tokenizer_keys} == {k: real.metadata[k] for k in tokenizer_keys}
    for key, shipped in load_tokenizer_metadata().items():  # value types as extracted from the real file
        assert reader.fields[key].types == [shipped.type, *[t for t in [shipped.item_type] if t is not None]]
    tokenizer, template = load_prompt_side(ours.metadata)
    assert tokenizer.vocab_size == 151_936 and template is not None


def test_recipe_reproduces_every_type_of_the_real_files(real_path: Path) -> None:
    files = {"qwen2.5-0.5b": real_path}
    big = models_dir() / PACKAGED_MODELS["qwen2.5-coder-1.5b"].filename
    if big.is_file():  # not assembled by this test (1.1 GB)
        files["qwen2.5-1.5b"] = big
    for name, path in files.items():
        real = [(t.name, t.shape, t.qtype, t.nbytes) for t in GGUFFile(path).tensors.values()]
        plan = [(p.name, p.shape, p.qtype, p.nbytes) for p in plan_tensors(BUILTIN_LAYOUTS[name])]
        assert plan == real, name
    counts = collections.Counter(p.qtype.name for p in plan_tensors(BUILTIN_LAYOUTS["qwen2.5-0.5b"]))
    assert counts == {"Q5_0": 133, "F32": 121, "Q8_0": 13, "Q6_K": 12, "Q4_K": 12}


def _by_name(layout: Layout) -> dict[str, tuple[tuple[int, ...], GGMLQuantizationType]]:
    return {p.name: (p.shape, p.qtype) for p in plan_tensors(layout)}


def _spec(layout: Layout) -> ModelSpec:
    meta = {k: v.value for k, v in layout_metadata(layout).items()}
    return spec_from_metadata(meta, {p.name for p in plan_tensors(layout)})


def test_7b_layout() -> None:
    layout = BUILTIN_LAYOUTS["qwen2.5-7b"]
    t = _by_name(layout)
    assert len(t) == 3 + 28 * 12
    assert t["token_embd.weight"] == ((152_064, 3584), _T.Q4_K)
    assert t["output.weight"] == ((152_064, 3584), _T.Q6_K)
    assert t["output_norm.weight"] == ((3584,), _T.F32)
    for i in range(28):
        more = _T.Q6_K if i in MORE_BITS_28 else _T.Q4_K
        assert t[f"blk.{i}.attn_q.weight"] == ((3584, 3584), _T.Q4_K)
        assert t[f"blk.{i}.attn_k.weight"] == ((512, 3584), _T.Q4_K)
        assert t[f"blk.{i}.attn_v.weight"] == ((512, 3584), more)
        assert t[f"blk.{i}.attn_output.weight"] == ((3584, 3584), _T.Q4_K)
        assert t[f"blk.{i}.ffn_gate.weight"] == ((18944, 3584), _T.Q4_K)
        assert t[f"blk.{i}.ffn_up.weight"] == ((18944, 3584), _T.Q4_K)
        assert t[f"blk.{i}.ffn_down.weight"] == ((3584, 18944), more)
        for bias, rows in (("q", 3584), ("k", 512), ("v", 512)):
            assert t[f"blk.{i}.attn_{bias}.bias"] == ((rows,), _T.F32)
    size = sum(p.nbytes for p in plan_tensors(layout))
    assert 4.6e9 < size < 4.7e9  # the published Qwen2.5-7B-Instruct Q4_K_M file is 4.68 GB
    spec = _spec(layout)
    assert (spec.num_layers, spec.hidden_size, spec.ffn_size, spec.vocab_size) == (28, 3584, 18944, 152_064)
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (28, 4, 128)


def test_qwen3_moe_layout() -> None:
    layout = BUILTIN_LAYOUTS["qwen3-30b-a3b"]
    t = _by_name(layout)
    assert len(t) == 3 + 48 * 12
    assert t["token_embd.weight"] == ((151_936, 2048), _T.Q4_K)
    assert t["output.weight"] == ((151_936, 2048), _T.Q6_K)
    for i in range(48):
        p = f"blk.{i}"
        assert t[f"{p}.attn_q.weight"] == ((4096, 2048), _T.Q4_K)
        assert t[f"{p}.attn_k.weight"] == ((512, 2048), _T.Q4_K)
        assert t[f"{p}.attn_v.weight"][0] == (512, 2048)
        assert t[f"{p}.attn_output.weight"] == ((2048, 4096), _T.Q4_K)
        assert t[f"{p}.attn_q_norm.weight"] == ((128,), _T.F32)
        assert t[f"{p}.attn_k_norm.weight"] == ((128,), _T.F32)
        assert t[f"{p}.ffn_gate_inp.weight"] == ((128, 2048), _T.F32)
        assert t[f"{p}.ffn_gate_exps.weight"] == ((128, 768, 2048), _T.Q4_K)
        assert t[f"{p}.ffn_up_exps.weight"] == ((128, 768, 2048), _T.Q4_K)
        # MoE: llama.cpp takes ffn_down's layer from the name, so this is use_more_bits(i, 48) itself.
        more = i < 6 or i >= 42 or (i - 6) % 3 == 2
        assert t[f"{p}.ffn_down_exps.weight"] == ((128, 2048, 768), _T.Q6_K if more else _T.Q4_K)
    assert sum(q == _T.Q6_K for name, (_, q) in t.items() if "attn_v" in name) == 24
    meta = layout_metadata(layout)
    assert meta["general.architecture"].value == "qwen3moe"
    assert meta["qwen3moe.expert_count"].value == 128
    assert meta["qwen3moe.expert_used_count"].value == 8
    assert meta["qwen3moe.expert_feed_forward_length"].value == 768
    assert meta["qwen3moe.attention.key_length"].value == 128
    size = sum(p.nbytes for p in plan_tensors(layout))
    assert 18.4e9 < size < 18.7e9  # published Qwen3-30B-A3B Q4_K_M files are about 18.6 GB


def _forward(path: Path, num_tokens: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    llm = LLM(ModelConfig(path))
    ids = llm.tokenizer.encode("def add(a, b):\n    return a + b\n")[:num_tokens]
    s = llm.spec
    kv = KVCache(s.num_layers, len(ids), s.num_kv_heads, s.head_dim, torch.float32)
    with torch.inference_mode():
        hidden = llm.model(torch.tensor(ids), kv, AttentionMetadata.contiguous(0, len(ids)))
        return hidden, llm.model.compute_logits(hidden)


@pytest.mark.parametrize("name", TINY_DENSE)
def test_tiny_layouts_load_and_run(name: str, tmp_path: Path) -> None:
    tiny, full = BUILTIN_LAYOUTS[name], BUILTIN_LAYOUTS[name.removesuffix("-tiny")]
    assert (tiny.architecture, tiny.recipe, tiny.vocab_size) == (
        full.architecture,
        full.recipe,
        full.vocab_size,
    )
    assert {p.qtype for p in plan_tensors(tiny)} == {p.qtype for p in plan_tensors(full)}
    stats = write_layout(tmp_path / f"{name}.gguf", tiny, threads=2)
    hidden, logits = _forward(stats.path)
    assert logits.shape[-1] == tiny.vocab_size
    assert torch.isfinite(hidden).all() and torch.isfinite(logits).all()
    assert 0.1 < logits.std().item() < 100  # not collapsed, not exploding


def test_moe_file_is_written_and_refused_clearly(tmp_path: Path) -> None:
    tiny = BUILTIN_LAYOUTS["qwen3-30b-a3b-tiny"]
    assert {p.qtype for p in plan_tensors(tiny)} == {
        p.qtype for p in plan_tensors(BUILTIN_LAYOUTS["qwen3-30b-a3b"])
    }
    path = write_layout(tmp_path / "moe.gguf", tiny, threads=2).path
    gguf = GGUFFile(path)
    assert gguf.tensor_info("blk.1.ffn_down_exps.weight").shape == (16, 256, 256)
    assert gguf.metadata["qwen3moe.expert_used_count"] == 4
    with pytest.raises(GGUFError, match="architecture 'qwen3moe' is not supported"):
        LLM(ModelConfig(path))


@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TYPES), ids=lambda t: t.name)
def test_random_blocks_dequantize_to_the_target_scale(qtype: GGMLQuantizationType) -> None:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    num_blocks = 8192 if block_size > 1 else 65536
    raw = random_data(qtype, num_blocks, 0.0, 0.03, np.random.SeedSequence(7))
    x = dequantize(torch.from_numpy(raw.copy()), qtype, (num_blocks * block_size,))
    assert torch.isfinite(x).all()
    rms = x.pow(2).mean().sqrt().item()
    assert abs(rms / 0.03 - 1) < 0.03, rms
    assert abs(x.mean().item()) < 0.15 * 0.03  # legacy types keep their half-step offset (-d/2)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_bytes_depend_on_the_seed_not_the_threads(tmp_path: Path) -> None:
    layout = BUILTIN_LAYOUTS["qwen2.5-0.5b-tiny"]
    one = write_layout(tmp_path / "a.gguf", layout, seed=5, threads=1).path
    two = write_layout(tmp_path / "b.gguf", layout, seed=5, threads=3).path
    other = write_layout(tmp_path / "c.gguf", layout, seed=6, threads=2).path
    assert _sha(one) == _sha(two) != _sha(other)
    assert not list(tmp_path.glob("*.partial"))


def test_shipped_tokenizer_metadata_equals_the_real_model(real_path: Path) -> None:
    shipped = load_tokenizer_metadata()
    real_meta = GGUFFile(real_path).metadata
    assert list(shipped) == [k for k in real_meta if k.startswith("tokenizer.")]
    for key, value in shipped.items():
        assert value.value == real_meta[key], key
    assert TOKENIZER_FILE.stat().st_size < 3_000_000  # it ships in the package


def test_padded_vocabulary_for_7b() -> None:
    meta = layout_metadata(BUILTIN_LAYOUTS["qwen2.5-7b"])
    tokens, types = meta["tokenizer.ggml.tokens"].value, meta["tokenizer.ggml.token_type"].value
    assert len(tokens) == len(types) == 152_064
    assert tokens[151_935] == load_tokenizer_metadata()["tokenizer.ggml.tokens"].value[-1]
    assert tokens[-1] == "[PAD152063]" and types[-1] == 5


@pytest.mark.parametrize("name", ["qwen2.5-0.5b-tiny", "qwen3-30b-a3b"])
def test_json_layout_round_trip(name: str, tmp_path: Path) -> None:
    layout = BUILTIN_LAYOUTS[name]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(layout.to_json()))
    assert load_layout(str(path)) == layout


def test_json_layout_with_defaults_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    spec = {
        "architecture": "qwen3",
        "num_layers": 2,
        "hidden_size": 256,
        "ffn_size": 512,
        "num_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 128,
        "recipe": "Q8_0",
        "overrides": {"blk.1.*": "Q4_K", "output.weight": "F16"},
    }
    path.write_text(json.dumps(spec))
    layout = load_layout(str(path))
    assert layout.name == "mine" and layout.vocab_size == 151_936
    t = _by_name(layout)
    assert t["blk.0.attn_q.weight"][1] == _T.Q8_0
    assert t["blk.1.attn_q.weight"][1] == _T.Q4_K
    assert t["blk.1.attn_q_norm.weight"][1] == _T.F32  # overrides apply to matrices only
    assert t["output.weight"][1] == _T.F16
    assert _spec(layout).architecture == "qwen3"


_GOOD = BUILTIN_LAYOUTS["qwen2.5-0.5b-tiny"].to_json()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_sise": 128}, "unknown field 'hidden_sise'"),
        ({"num_heads": None}, "field 'num_heads' is required"),
        ({"num_layers": "2"}, "field 'num_layers' must be an integer"),
        ({"tied_embeddings": 1}, "field 'tied_embeddings' must be true or false"),
        ({"hidden_size": 0}, "hidden_size is 0"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"architecture": "mamba"}, "architecture 'mamba'"),
        ({"architecture": "qwen3moe"}, "num_experts is required"),
        ({"num_experts": 4}, "num_experts is only for architecture qwen3moe"),
        ({"recipe": "Q9_K"}, "recipe 'Q9_K'"),
        ({"vocab_size": 1000}, "vocab_size 1000"),
        ({"overrides": {"*": "IQ1_S"}}, "overrides['*'] type 'IQ1_S'"),
        ({"overrides": ["Q8_0"]}, "field 'overrides' must be"),
    ],
)
def test_bad_layout_names_the_field(change: dict[str, object], message: str) -> None:
    obj = {k: v for k, v in (_GOOD | change).items() if v is not None}
    with pytest.raises(LayoutError, match=re.escape(message)):
        layout_from_json(obj)


def test_override_that_does_not_fit_the_rows_is_refused() -> None:
    layout = layout_from_json(_GOOD | {"overrides": {"blk.0.attn_q.weight": "Q4_K"}})  # rows of 128
    with pytest.raises(LayoutError, match="blk.0.attn_q.weight type Q4_K"):
        plan_tensors(layout)


def test_cli_errors_and_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_GOOD | {"num_layers": -1}))
    assert main(["synth", str(bad), str(tmp_path / "x.gguf")]) == 2
    assert "num_layers is -1" in capsys.readouterr().err
    assert main(["synth", "no-such-layout", str(tmp_path / "x.gguf")]) == 2
    assert "neither a built-in layout" in capsys.readouterr().err
    assert main(["synth", "qwen2.5-0.5b"]) == 2
    assert "needs SPEC and OUT.gguf" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.gguf*"))
    assert main(["synth", "--list"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in BUILTIN_LAYOUTS)


@pytest.mark.slow
def test_full_size_0_5b_runs_with_finite_activations(tmp_path: Path) -> None:
    path = write_layout(tmp_path / "qwen2.5-0.5b.gguf", BUILTIN_LAYOUTS["qwen2.5-0.5b"]).path
    hidden, logits = _forward(path, num_tokens=8)
    assert torch.isfinite(hidden).all() and torch.isfinite(logits).all()
    assert 0.1 < logits.std().item() < 100
