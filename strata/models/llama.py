"""`llama`: pre-norm blocks of grouped-query attention and a SwiGLU feed-forward."""

from __future__ import annotations

import torch
from torch import nn

from strata.engine.kv_cache import AttentionMetadata, KVCache
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.layers.activation import gated
from strata.layers.attention import Attention
from strata.layers.linear import QuantLinear
from strata.layers.norm import RMSNorm
from strata.layers.placement import Placement
from strata.layers.rotary import RotaryEmbedding
from strata.models.base import DecoderModel


class LlamaBlock(nn.Module):
    """x += attn_output(attn(rope(q), rope(k), v)); x += ffn_down(silu(ffn_gate(h)) * ffn_up(h)).

    Q/K/V biases (Qwen2) load when the file has them; the forward is the same either way.
    """

    def __init__(self, gguf: GGUFFile, spec: ModelSpec, layer: int, place: Placement) -> None:
        super().__init__()
        p = f"blk.{layer}"
        self.spec = spec
        self.attn_norm = RMSNorm(gguf, f"{p}.attn_norm", spec.rms_eps, place.kernels)
        self.attn_q = QuantLinear.load(gguf, f"{p}.attn_q", place)
        self.attn_k = QuantLinear.load(gguf, f"{p}.attn_k", place)
        self.attn_v = QuantLinear.load(gguf, f"{p}.attn_v", place)
        self.attn_output = QuantLinear.load(gguf, f"{p}.attn_output", place)
        self.ffn_norm = RMSNorm(gguf, f"{p}.ffn_norm", spec.rms_eps, place.kernels)
        self.ffn_gate = QuantLinear.load(gguf, f"{p}.ffn_gate", place)
        self.ffn_up = QuantLinear.load(gguf, f"{p}.ffn_up", place)
        self.ffn_down = QuantLinear.load(gguf, f"{p}.ffn_down", place)
        rotary = RotaryEmbedding(spec.rope_dim, spec.rope_base, spec.rope_layout, spec.rope_scale)
        self.attn = Attention(
            layer, spec.num_heads, spec.num_kv_heads, spec.attn_scale, None, rotary, place.kernels
        )
        self.fused = place.kernels

    def qkv(self, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(num_tokens, hidden) -> q (tokens, heads, dim), k and v (tokens, kv_heads, dim), not rotated."""
        n, s = h.shape[0], self.spec
        q = self.attn_q(h).view(n, s.num_heads, s.head_dim)
        k = self.attn_k(h).view(n, s.num_kv_heads, s.head_dim)
        v = self.attn_v(h).view(n, s.num_kv_heads, s.head_dim)
        return q, k, v

    def forward(self, x: torch.Tensor, kv: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv(self.attn_norm(x))
        h, x = self.ffn_norm.add_and_norm(self.attn_output(self.attn(q, k, v, kv, meta)), x)
        return x + self.ffn_down(gated("silu", self.ffn_gate(h), self.ffn_up(h), self.fused))


class LlamaModel(DecoderModel):
    def build_block(self, gguf: GGUFFile, layer: int) -> nn.Module:
        return LlamaBlock(gguf, self.spec, layer, self.place)
