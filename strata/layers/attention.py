"""Grouped-query attention over a paged KV store handed in by the caller (torch reference)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from strata.engine.kv_cache import AttentionMetadata, KVCache


class Attention(nn.Module):
    """Writes this step's K/V at their slots, then attends each sequence over its context's slots."""

    def __init__(self, layer: int, num_heads: int, num_kv_heads: int, scale: float, window: int | None):
        super().__init__()
        self.layer, self.num_heads, self.num_kv_heads = layer, num_heads, num_kv_heads
        self.scale, self.window = scale, window

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        # q: (num_tokens, num_heads, head_dim); k, v: (num_tokens, num_kv_heads, head_dim)
        kv.write(self.layer, meta.slot_mapping, k, v)
        outs = []
        for seq, rows in enumerate(meta.query_slices()):
            keys, values = kv.read(self.layer, meta.context_slots[seq])  # (context_len, kv_heads, dim)
            out = F.scaled_dot_product_attention(
                q[rows].transpose(0, 1),
                keys.to(q.dtype).transpose(0, 1),
                values.to(q.dtype).transpose(0, 1),
                attn_mask=meta.mask(seq, rows, self.window),
                scale=self.scale,
                enable_gqa=self.num_heads != self.num_kv_heads,
            )
            outs.append(out.transpose(0, 1))
        return torch.cat(outs).flatten(1)  # (num_tokens, num_heads * head_dim)
