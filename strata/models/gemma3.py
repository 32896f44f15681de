"""`gemma3`: sandwich norms, QK-norm, GeGLU, and sliding-window layers with their own rotary base."""

from __future__ import annotations

import torch
from torch import nn

from strata.engine.kv_cache import AttentionMetadata, KVCache
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.layers.attention import Attention
from strata.layers.linear import Projections, QuantLinear
from strata.layers.norm import RMSNorm
from strata.layers.placement import Placement
from strata.layers.rotary import RotaryEmbedding
from strata.models.base import DecoderModel


class Gemma3Block(nn.Module):
    """x += post_attention_norm(attn(...)); x += post_ffw_norm(ffn_down(gelu(ffn_gate(h)) * ffn_up(h)))."""

    def __init__(self, gguf: GGUFFile, spec: ModelSpec, layer: int, place: Placement) -> None:
        super().__init__()
        p, eps = f"blk.{layer}", spec.rms_eps
        self.spec = spec
        self.num_heads, self.num_kv_heads = place.tp.local(spec.num_heads), place.tp.local(spec.num_kv_heads)
        self.attn_norm = RMSNorm.load(gguf, f"{p}.attn_norm", eps, place.kernels)
        self.qkv_proj = Projections.load(gguf, p, ("attn_q", "attn_k", "attn_v"), place)
        self.attn_q_norm = RMSNorm.load(gguf, f"{p}.attn_q_norm", eps, place.kernels)
        self.attn_k_norm = RMSNorm.load(gguf, f"{p}.attn_k_norm", eps, place.kernels)
        self.attn_output = QuantLinear.load(gguf, f"{p}.attn_output", place)
        self.post_attention_norm = RMSNorm.load(gguf, f"{p}.post_attention_norm", eps, place.kernels)
        self.ffn_norm = RMSNorm.load(gguf, f"{p}.ffn_norm", eps, place.kernels)
        self.gate_up = Projections.load(gguf, p, ("ffn_gate", "ffn_up"), place)
        self.ffn_down = QuantLinear.load(gguf, f"{p}.ffn_down", place)
        self.post_ffw_norm = RMSNorm.load(gguf, f"{p}.post_ffw_norm", eps, place.kernels)
        sliding = spec.is_sliding(layer)
        base = spec.local_rope_base if sliding and spec.local_rope_base else spec.rope_base
        # Linear rope scaling applies to the global layers only (as in HF's Gemma 3).
        scale = 1.0 if sliding else spec.rope_scale
        rotary = RotaryEmbedding(spec.rope_dim, base, spec.rope_layout, scale)
        window = spec.sliding_window if sliding else None
        self.attn = Attention(
            layer, self.num_heads, self.num_kv_heads, spec.attn_scale, window, rotary, place.kernels
        )

    def forward(
        self, x: torch.Tensor, delta: torch.Tensor | None, kv: KVCache, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x + delta in, x + delta out, as `LlamaBlock.forward`."""
        n, dim = x.shape[0], self.spec.head_dim
        h, x = self.attn_norm.add_and_norm(delta, x)
        q, k, v = self.qkv_proj(h)
        q = self.attn_q_norm(q.view(n, self.num_heads, dim))
        k = self.attn_k_norm(k.view(n, self.num_kv_heads, dim))
        v = v.view(n, self.num_kv_heads, dim)
        attn = self.post_attention_norm(self.attn_output(self.attn(q, k, v, kv, meta)))
        h, x = self.ffn_norm.add_and_norm(attn, x)
        gate, up = self.gate_up(h)
        return x, self.post_ffw_norm(self.ffn_down(gate, up, "gelu_tanh"))


class Gemma3Model(DecoderModel):
    def build_block(self, gguf: GGUFFile, layer: int) -> nn.Module:
        return Gemma3Block(gguf, self.spec, layer, self.place)
