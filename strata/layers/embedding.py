"""Token embeddings looked up straight from the quantized GGUF table."""

from __future__ import annotations

import torch
from torch import nn

from strata.gguf.reader import GGUFFile
from strata.layers.linear import QuantLinear
from strata.layers.placement import Placement
from strata.quant import dequantize_rows


class QuantEmbedding(nn.Module):
    """Dequantizes only the looked-up rows: the table (often the largest tensor) stays quantized."""

    def __init__(self, gguf: GGUFFile, name: str, place: Placement, scale: float = 1.0) -> None:
        super().__init__()
        info = gguf.tensor_info(f"{name}.weight")
        self.qtype, self.shape = info.qtype, info.shape
        self.qweight = gguf.tensor_bytes(info.name).to(place.device)
        self.place, self.scale = place, scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # (num_tokens,) -> (num_tokens, hidden)
        rows = dequantize_rows(self.qweight, self.qtype, self.shape, ids)
        if self.scale != 1.0:
            # Gemma rounds the scale to the activation dtype before multiplying (as llama.cpp and HF do).
            rows = rows * torch.tensor(self.scale, dtype=self.place.dtype).float()
        return rows.to(self.place.dtype)

    def as_output_head(self) -> QuantLinear:
        """The table as the output projection, for models whose head is tied to the embeddings."""
        vocab, hidden = self.shape
        return QuantLinear(self.qweight, self.qtype, (vocab, hidden), self.place)
