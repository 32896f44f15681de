"""Every architecture's forward pass against transformers on tiny random-weight GGUFs.

No real llama or qwen3 weights are available here, so these check the layouts (rotary pairing,
biases, QK-norm, sandwich norms, sliding windows, tied heads) where the real files cannot.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from strata.engine.kv_cache import AttentionMetadata, KVCache
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.gguf.synth import SynthSpec, write_synthetic
from strata.models import build_model
from tests.hf_reference import hf_logits, load_hf_model

# transformers reads no head_dim from qwen3 GGUFs (it assumes 128) and scales Gemma 3 queries by
# 1/sqrt(256) whatever the head size, so those two use the sizes the reference assumes.
SPECS = {
    "llama": SynthSpec("llama"),
    "qwen2": SynthSpec("qwen2"),
    "qwen3": SynthSpec("qwen3", num_heads=2, num_kv_heads=1, head_dim=128),
    "gemma3": SynthSpec("gemma3", num_heads=2, num_kv_heads=1, head_dim=256, tied_embeddings=True),
}


def _our_logits(path: Path, ids: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gguf = GGUFFile(path)
    spec = ModelSpec.from_gguf(gguf)
    model = build_model(gguf, spec, dtype)
    kv = KVCache(spec.num_layers, len(ids), spec.num_kv_heads, spec.head_dim, dtype)
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids), kv, AttentionMetadata.contiguous(0, len(ids))))


@pytest.mark.parametrize("arch", sorted(SPECS))
def test_matches_transformers(arch: str, tmp_path: Path) -> None:
    path = write_synthetic(tmp_path / f"{arch}.gguf", SPECS[arch])
    ids = torch.randint(0, 257, (24,), generator=torch.Generator().manual_seed(1)).tolist()  # > window 8
    ours = _our_logits(path, ids)
    ref = hf_logits(load_hf_model(path), ids)
    diff = (ours - ref).abs().max().item()
    print(f"{arch}: max |logit diff| {diff:.2e}")
    assert diff < 1e-4
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_bfloat16_option_tracks_float32(tmp_path: Path) -> None:
    path = write_synthetic(tmp_path / "qwen2.gguf", SPECS["qwen2"])
    ids = list(range(10, 30))
    ref, bf16 = _our_logits(path, ids), _our_logits(path, ids, torch.bfloat16)
    assert bf16.dtype == torch.float32
    assert (bf16 - ref).abs().max().item() < 0.05 * ref.abs().max().item()


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_incremental_decode_matches_one_prefill(arch: str, tmp_path: Path) -> None:
    """Prefill in pieces, then one token at a time, through the KV store == one full prefill."""
    path = write_synthetic(tmp_path / f"{arch}.gguf", SPECS[arch])
    gguf = GGUFFile(path)
    spec = ModelSpec.from_gguf(gguf)
    model = build_model(gguf, spec)
    ids = torch.randint(0, 257, (20,), generator=torch.Generator().manual_seed(2))
    full = _our_logits(path, ids.tolist())
    kv = KVCache(spec.num_layers, 20, spec.num_kv_heads, spec.head_dim, torch.float32)
    pieces = []
    with torch.inference_mode():
        for start, end in [(0, 7), (7, 15), *((i, i + 1) for i in range(15, 20))]:
            hidden = model(ids[start:end], kv, AttentionMetadata.contiguous(start, end - start))
            pieces.append(model.compute_logits(hidden))
    assert torch.allclose(torch.cat(pieces), full, atol=1e-5, rtol=0)
