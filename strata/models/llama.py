"""`llama`: pre-norm blocks of grouped-query attention and a SwiGLU feed-forward."""

from __future__ import annotations

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from strata.kernels.kv_in_matvec import KVWrite


class LlamaBlock(nn.Module):
    """x += attn_output(attn(rope(q), rope(k), v)); x += ffn_down(silu(ffn_gate(h)) * ffn_up(h)).

    Q/K/V biases (Qwen2) load when the file has them; the forward is the same either way. Under tensor
    parallelism the block holds this rank's heads (`num_heads`, `num_kv_heads`) and its run of FFN rows,
    whose width (set by the loaded layers, never computed here) may differ from other ranks'.
    """

    def __init__(self, gguf: GGUFFile, spec: ModelSpec, layer: int, place: Placement) -> None:
        super().__init__()
        p = f"blk.{layer}"
        self.spec = spec
        self.num_heads, self.num_kv_heads = place.tp.local(spec.num_heads), place.tp.local(spec.num_kv_heads)
        self.attn_norm = RMSNorm.load(gguf, f"{p}.attn_norm", spec.rms_eps, place.kernels)
        self.qkv_proj = Projections.load(gguf, p, ("attn_q", "attn_k", "attn_v"), place)
        self.attn_output = QuantLinear.load(gguf, f"{p}.attn_output", place)
        self.ffn_norm = RMSNorm.load(gguf, f"{p}.ffn_norm", spec.rms_eps, place.kernels)
        self.gate_up = Projections.load(gguf, p, ("ffn_gate", "ffn_up"), place)
        self.ffn_down = QuantLinear.load(gguf, f"{p}.ffn_down", place)
        self.attn_norm.quantize_for(self.qkv_proj)
        self.ffn_norm.quantize_for(self.gate_up)
        rotary = RotaryEmbedding(spec.rope_dim, spec.rope_base, spec.rope_layout, spec.rope_scale)
        self.attn = Attention(
            layer, self.num_heads, self.num_kv_heads, spec.attn_scale, None, rotary, place.kernels
        )
        self.attn.quantize_for(self.attn_output)

    def qkv(self, h: torch.Tensor, kv_write: KVWrite | None = None) -> tuple[torch.Tensor, ...]:
        """(num_tokens, hidden) -> q (tokens, heads, dim), k and v (tokens, kv_heads, dim), not rotated;
        with `kv_write`, q rotated and K/V written to the cache instead (`Attention.kv_write`)."""
        n = h.shape[0]
        q, k, v = self.qkv_proj(h, kv_write)
        return (
            q.view(n, self.num_heads, self.spec.head_dim),
            k.view(n, self.num_kv_heads, -1),
            v.view(n, self.num_kv_heads, -1),
        )

    def kv_write(self, h: torch.Tensor, kv: KVCache, meta: AttentionMetadata) -> KVWrite | None:
        """The rotary embedding and K/V write to make in the q, k, v matvecs (`Attention.kv_write`)."""
        return self.attn.kv_write(h, self.qkv_proj, kv, meta)

    def forward(
        self, x: torch.Tensor, delta: torch.Tensor | None, kv: KVCache, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stream comes in and goes out as x + delta (delta None before the first block), so each
        residual add is fused into the norm that follows it."""
        h, x = self.attn_norm.add_and_norm(delta, x)
        write = self.kv_write(h, kv, meta)
        q, k, v = self.qkv(h, kv_write=write)
        attended = self.attn(q, k, v, kv, meta, written=write is not None)
        h, x = self.ffn_norm.add_and_norm(self.attn_output(attended), x)
        gate, up = self.gate_up(h)
        return x, self.ffn_down(gate, up, "silu")


class LlamaModel(DecoderModel):
    def build_block(self, gguf: GGUFFile, layer: int) -> nn.Module:
        return LlamaBlock(gguf, self.spec, layer, self.place)
