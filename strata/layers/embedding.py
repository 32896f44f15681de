"""Token embeddings looked up straight from the quantized GGUF table."""

from __future__ import annotations

import torch
from torch import nn

from strata.gguf.reader import GGUFFile
from strata.layers.linear import QuantLinear
from strata.layers.placement import Placement
from strata.parallel.group import all_reduce
from strata.parallel.shard import row_bytes, vocab_range
from strata.quant import dequantize_rows


class QuantEmbedding(nn.Module):
    """Dequantizes only the looked-up rows: the table (often the largest tensor) stays quantized.

    Under tensor parallelism each rank holds a run of the vocabulary (`strata.parallel.shard`): it
    looks up the ids in its run, leaves zeros for the others, and an all-reduce sums the ranks' rows.
    Exactly one rank contributes each row, so the sum is exact: the same values as on one rank.
    """

    def __init__(self, gguf: GGUFFile, name: str, place: Placement, scale: float = 1.0) -> None:
        super().__init__()
        info = gguf.tensor_info(f"{name}.weight")
        self.qtype, self.shape = info.qtype, info.shape
        raw = gguf.tensor_bytes(info.name)
        self.start = 0
        if place.tp.size > 1:
            self.start, end = vocab_range(info.name, info.shape[0], place.tp)
            raw, self.shape = (
                row_bytes(raw, info.qtype, info.shape, self.start, end),
                (end - self.start, info.shape[1]),
            )
        self.qweight = raw.to(place.device)
        self.place, self.scale = place, scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # (num_tokens,) -> (num_tokens, hidden)
        split = self.place.tp.size > 1
        if split:  # ids outside this rank's run look up its row 0 and are zeroed below
            local = ids - self.start
            mine = (local >= 0) & (local < self.shape[0])
            ids = torch.where(mine, local, 0)
        rows = dequantize_rows(self.qweight, self.qtype, self.shape, ids)
        if self.scale != 1.0:
            # Gemma rounds the scale to the activation dtype before multiplying (as llama.cpp and HF do).
            rows = rows * torch.tensor(self.scale, dtype=self.place.dtype).float()
        if not split:
            return rows.to(self.place.dtype)
        return all_reduce(torch.where(mine[:, None], rows, 0.0).to(self.place.dtype), self.place.tp)

    def as_output_head(self) -> QuantLinear:
        """The table as the output projection, for models whose head is tied to the embeddings (under
        tensor parallelism: this rank's vocabulary rows, as the head splits them too)."""
        vocab, hidden = self.shape
        return QuantLinear(self.qweight, self.qtype, (vocab, hidden), self.place)
