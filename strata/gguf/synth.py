"""Writing small synthetic GGUF models: random weights in the real tensor layout of an architecture.

Used by tests (architectures with no real weights available here, damaged-file cases) and, at full
size, for timing. The vocabulary is the 256 byte-level symbols plus end-of-text, so the file also
carries a valid (if trivial) byte-level BPE tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType
from gguf.quants import quantize

from strata.prompt.tokenizer import byte_level_chars


@dataclass(frozen=True)
class SynthSpec:
    architecture: str = "llama"
    num_layers: int = 2
    hidden_size: int = 64
    ffn_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    context_length: int = 256
    rope_base: float = 10_000.0
    weight_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0
    tied_embeddings: bool = False
    seed: int = 0


def _tensor_shapes(s: SynthSpec, vocab: int) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> torch-order shape (rows, cols)."""
    q, kv, h, f = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.hidden_size, s.ffn_size
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (vocab, h), "output_norm.weight": (h,)}
    if not s.tied_embeddings:
        shapes["output.weight"] = (vocab, h)
    for i in range(s.num_layers):
        p = f"blk.{i}"
        shapes |= {
            f"{p}.attn_norm.weight": (h,),
            f"{p}.attn_q.weight": (q, h),
            f"{p}.attn_k.weight": (kv, h),
            f"{p}.attn_v.weight": (kv, h),
            f"{p}.attn_output.weight": (h, q),
            f"{p}.ffn_norm.weight": (h,),
            f"{p}.ffn_gate.weight": (f, h),
            f"{p}.ffn_up.weight": (f, h),
            f"{p}.ffn_down.weight": (h, f),
        }
        if s.architecture == "qwen2":
            shapes |= {f"{p}.attn_q.bias": (q,), f"{p}.attn_k.bias": (kv,), f"{p}.attn_v.bias": (kv,)}
        if s.architecture in ("qwen3", "gemma3"):
            shapes |= {f"{p}.attn_q_norm.weight": (s.head_dim,), f"{p}.attn_k_norm.weight": (s.head_dim,)}
        if s.architecture == "gemma3":
            shapes |= {f"{p}.post_attention_norm.weight": (h,), f"{p}.post_ffw_norm.weight": (h,)}
    return shapes


def write_synthetic(path: str | Path, s: SynthSpec) -> Path:
    """Write a random-weight GGUF for `s` at `path` and return the path."""
    rng = np.random.default_rng(s.seed)
    tokens = [*byte_level_chars(), "<|endoftext|>"]
    arch = s.architecture
    w = GGUFWriter(str(path), arch)
    w.add_block_count(s.num_layers)
    w.add_context_length(s.context_length)
    w.add_embedding_length(s.hidden_size)
    w.add_feed_forward_length(s.ffn_size)
    w.add_head_count(s.num_heads)
    w.add_head_count_kv(s.num_kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    if arch == "gemma3":
        w.add_sliding_window(8)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3])
    w.add_token_merges([])
    w.add_eos_token_id(len(tokens) - 1)
    w.add_bos_token_id(len(tokens) - 1)
    for name, shape in _tensor_shapes(s, len(tokens)).items():
        if name.endswith("norm.weight"):
            data = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            w.add_tensor(name, data)
            continue
        data = (0.5 * rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        if len(shape) == 1 or s.weight_type == GGMLQuantizationType.F32:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, quantize(data, s.weight_type), raw_dtype=s.weight_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
