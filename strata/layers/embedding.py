"""Token embeddings looked up straight from the quantized GGUF table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from gguf.constants import GGMLQuantizationType
from torch import nn

from strata.gguf.reader import GGUFFile
from strata.layers.linear import QuantLinear
from strata.layers.placement import Placement
from strata.parallel.group import all_reduce
from strata.parallel.shard import row_bytes, vocab_range
from strata.quant import dequantize_rows

# strata.kernels needs triton, which a CPU-only install may lack: imported only on the kernel path.
if TYPE_CHECKING:
    from strata.kernels.quant_pack import PackedQuantWeight


class QuantEmbedding(nn.Module):
    """Dequantizes only the looked-up rows: the table (often the largest tensor) stays quantized. On
    the kernel path, for the types it has, the table is packed once (shared with a tied output head)
    and a lookup is one Triton launch (`dequantize_packed` with `rows`) instead of the dozen torch
    operations of `dequantize_rows`: the same values.

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
        self.place, self.scale = place, scale
        # The stored bytes, or on the kernel path the packed planes only (the same bytes regrouped).
        self.qweight: torch.Tensor | None = raw.to(place.device)
        self.packed: PackedQuantWeight | None = None
        if place.kernels and _has_gather_kernel(self.qtype):
            from strata.kernels.quant_pack import pack_quant_weight

            vocab, hidden = self.shape
            self.packed = pack_quant_weight(self.qweight, self.qtype, vocab, hidden)
            self.qweight = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # (num_tokens,) -> (num_tokens, hidden)
        split = self.place.tp.size > 1
        if split:  # ids outside this rank's run look up its row 0 and are zeroed below
            local = ids - self.start
            mine = (local >= 0) & (local < self.shape[0])
            ids = torch.where(mine, local, 0)
        if self.packed is not None:
            from strata.kernels.dequant_packed import dequantize_packed

            plain = self.scale == 1.0 and not split  # rounded straight to the model's dtype
            rows = dequantize_packed(self.packed, self.place.dtype if plain else torch.float32, rows=ids)
            if plain:
                return rows
        else:
            assert self.qweight is not None
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
        table = self.packed if self.packed is not None else self.qweight
        assert table is not None
        return QuantLinear(table, self.qtype, (vocab, hidden), self.place)


def _has_gather_kernel(qtype: GGMLQuantizationType) -> bool:
    """Whether `dequantize_packed` decodes this type (it needs triton: imported only when asked)."""
    from strata.kernels.quant_matmul import MATMUL_TYPES

    return qtype in MATMUL_TYPES
