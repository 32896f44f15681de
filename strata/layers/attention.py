"""Grouped-query attention over a KV store handed in by the caller (torch reference)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from strata.engine.kv_cache import AttentionMetadata, KVCache


class Attention(nn.Module):
    """Writes this step's K/V at their slots, then attends over the context's slots."""

    def __init__(self, layer: int, num_heads: int, num_kv_heads: int, scale: float, window: int | None):
        super().__init__()
        self.layer, self.num_heads, self.num_kv_heads = layer, num_heads, num_kv_heads
        self.scale, self.window = scale, window

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        # q: (num_tokens, num_heads, head_dim); k, v: (num_tokens, num_kv_heads, head_dim)
        kv.write(self.layer, meta.slot_mapping, k, v)
        keys, values = kv.read(self.layer, meta.context_slots)  # (context_len, num_kv_heads, head_dim)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            keys.to(q.dtype).transpose(0, 1),
            values.to(q.dtype).transpose(0, 1),
            attn_mask=meta.mask(self.window),
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return out.transpose(0, 1).flatten(1)  # (num_tokens, num_heads * head_dim)
