"""`ModelSpec`: the architecture hyper-parameters of a GGUF file, frozen and validated once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from strata.gguf.reader import GGUFError, GGUFFile

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")

RopeLayout = Literal["interleaved", "neox"]

# llama.cpp's llama-arch table: "llama" GGUFs carry Q/K permuted so rotary pairs are adjacent
# (LLAMA_ROPE_TYPE_NORM); Qwen and Gemma keep HF's rotate-half pairing (LLAMA_ROPE_TYPE_NEOX).
_ROPE_LAYOUT: dict[str, RopeLayout] = {
    "llama": "interleaved",
    "qwen2": "neox",
    "qwen3": "neox",
    "gemma3": "neox",
}
# Gemma 3's local (sliding-window) layers use their own rotary base, which the GGUF does not store.
_GEMMA3_LOCAL_ROPE_BASE = 10_000.0
_GEMMA3_SLIDING_PATTERN = 6  # every sixth layer is global


@dataclass(frozen=True)
class ModelSpec:
    """Everything the forward pass needs to know about the architecture, and nothing about weights."""

    architecture: str
    num_layers: int
    hidden_size: int
    ffn_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    rope_layout: RopeLayout
    rope_scale: float = 1.0  # linear position scaling (positions are divided by it)
    local_rope_base: float | None = None  # rotary base of sliding-window layers, when it differs
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()  # per layer: does it attend only within the window
    attn_scale: float = 0.0  # softmax scale; 0 means 1/sqrt(head_dim)
    embed_scale: float = 1.0  # token embeddings are multiplied by it (Gemma: sqrt(hidden))
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise GGUFError(
                f"architecture {self.architecture!r} is not supported; strata runs {SUPPORTED_ARCHITECTURES}"
            )
        for name in ("num_layers", "hidden_size", "ffn_size", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise GGUFError(f"{self.architecture}: {name} is {getattr(self, name)}; it must be positive")
        if self.num_heads % self.num_kv_heads:
            raise GGUFError(
                f"{self.architecture}: {self.num_heads} attention heads are not a multiple of "
                f"{self.num_kv_heads} KV heads"
            )
        if self.rope_dim > self.head_dim or self.rope_dim % 2:
            raise GGUFError(f"{self.architecture}: rotary dim {self.rope_dim} vs head dim {self.head_dim}")
        if self.sliding_layers and len(self.sliding_layers) != self.num_layers:
            raise GGUFError(f"{self.architecture}: sliding-window pattern does not cover every layer")
        if self.attn_scale == 0.0:
            object.__setattr__(self, "attn_scale", 1.0 / math.sqrt(self.head_dim))

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def is_sliding(self, layer: int) -> bool:
        return bool(self.sliding_layers) and self.sliding_layers[layer]

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> ModelSpec:
        return spec_from_metadata(gguf.metadata, set(gguf.tensors), str(gguf.path))


def spec_from_metadata(meta: dict[str, Any], tensor_names: set[str], source: str = "GGUF") -> ModelSpec:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(SUPPORTED_ARCHITECTURES)
        raise GGUFError(f"{source}: architecture {arch!r} is not supported; strata runs {supported}")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise GGUFError(f"{source}: metadata {arch}.{key} is missing")
        return value

    hidden = int(get("embedding_length"))
    num_heads = int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // num_heads))
    num_layers = int(get("block_count"))
    if "token_embd.weight" not in tensor_names:
        raise GGUFError(f"{source}: tensor 'token_embd.weight' is missing")
    vocab = len(meta.get("tokenizer.ggml.tokens", ())) or int(get("vocab_size"))
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise GGUFError(f"{source}: rope scaling {scaling!r} is not supported (only none and linear)")
    extra: dict[str, Any] = {}
    if arch == "gemma3":
        window = int(get("attention.sliding_window"))
        extra = dict(
            local_rope_base=_GEMMA3_LOCAL_ROPE_BASE,
            sliding_window=window,
            sliding_layers=tuple((i + 1) % _GEMMA3_SLIDING_PATTERN != 0 for i in range(num_layers)),
            embed_scale=math.sqrt(hidden),
        )
    return ModelSpec(
        architecture=arch,
        num_layers=num_layers,
        hidden_size=hidden,
        ffn_size=int(get("feed_forward_length")),
        num_heads=num_heads,
        num_kv_heads=int(get("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        vocab_size=vocab,
        context_length=int(get("context_length")),
        rms_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_base=float(get("rope.freq_base", 10_000.0)),
        rope_dim=int(get("rope.dimension_count", head_dim)),
        rope_layout=_ROPE_LAYOUT[arch],
        rope_scale=float(get("rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0,
        tied_embeddings="output.weight" not in tensor_names,
        **extra,
    )
