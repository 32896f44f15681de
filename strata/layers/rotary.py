"""Rotary position embeddings in the two layouts GGUF files use."""

from __future__ import annotations

import torch
from torch import nn

from strata.gguf.spec import RopeLayout


class RotaryEmbedding(nn.Module):
    """Rotates the first `dim` channels of each head by position-dependent angles.

    "neox" pairs channel i with i + dim/2 (HF's rotate_half; Qwen, Gemma); "interleaved" pairs 2i with
    2i + 1 (llama.cpp's llama layout, whose converter permutes Q/K rows into it).
    """

    def __init__(self, dim: int, base: float, layout: RopeLayout, scale: float = 1.0) -> None:
        super().__init__()
        self.dim, self.layout, self.scale = dim, layout, scale
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, num_heads, head_dim); positions: (num_tokens,)
        angles = (positions.float() / self.scale)[:, None] * self.inv_freq[None, :]  # (num_tokens, dim/2)
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        rot, rest = x[..., : self.dim].float(), x[..., self.dim :]
        if self.layout == "neox":
            x1, x2 = rot.chunk(2, dim=-1)
            out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((out.to(x.dtype), rest), dim=-1) if rest.numel() else out.to(x.dtype)
