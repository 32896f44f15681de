"""What every decoder-only model shares: embed, run the blocks, norm, project to the vocabulary."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from tqdm import tqdm

from strata.engine.kv_cache import AttentionMetadata, KVCache
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.layers.embedding import QuantEmbedding
from strata.layers.linear import QuantLinear
from strata.layers.norm import RMSNorm
from strata.layers.placement import Placement
from strata.parallel.group import all_gather_last

if TYPE_CHECKING:
    from strata.parallel.leader import Leader

# The rows of a step's hidden states whose logits are wanted: a list of row indices, or a slice.
Rows = list[int] | slice


class DecoderModel(nn.Module):
    """Subclasses build `self.blk` (one block per GGUF `blk.N`); attributes follow GGUF tensor names."""

    def __init__(self, gguf: GGUFFile, spec: ModelSpec, place: Placement, progress: bool = False) -> None:
        super().__init__()
        self.spec, self.place, self.dtype = spec, place, place.dtype
        self.token_embd = QuantEmbedding(gguf, "token_embd", place, scale=spec.embed_scale)
        layers = tqdm(range(spec.num_layers), desc="load layers", disable=not progress, leave=False)
        self.blk = nn.ModuleList(self.build_block(gguf, i) for i in layers)
        self.output_norm = RMSNorm.load(gguf, "output_norm", spec.rms_eps, place.kernels)
        tied = spec.tied_embeddings
        self.output = self.token_embd.as_output_head() if tied else QuantLinear.load(gguf, "output", place)
        self.output_norm.quantize_for(self.output)  # a decode graph's head reads the norm's int8 copy
        head = "token_embd" if tied else "output"
        self.vocab_rows = gguf.tensor_info(f"{head}.weight").shape[0]  # logits width, all ranks together
        # Rank 0 of a tensor-parallel model: tells the other ranks each step before running it.
        self.leader: Leader | None = None
        # Norm weights, rotary tables and biases are built on the CPU; the big weights went straight
        # to the device in their layers.
        self.to(place.device)

    @property
    def device(self) -> torch.device:
        return self.place.device

    def build_block(self, gguf: GGUFFile, layer: int) -> nn.Module:
        raise NotImplementedError

    def forward(self, ids: torch.Tensor, kv: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """(num_tokens,) ids -> (num_tokens, hidden) final hidden states, K/V written into `kv`."""
        x, delta = self.token_embd(ids), None
        for block in self.blk:
            x, delta = block(x, delta, kv, meta)
        return self.output_norm.add_and_norm(delta, x)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, hidden) -> (n, vocab) float32 logits; callers pick the rows they need first. Under tensor
        parallelism each rank computes its vocabulary slice and every rank gets the whole row."""
        return all_gather_last(self.output(hidden).float(), self.place.tp, self.vocab_rows)

    def step(self, ids: torch.Tensor, kv: KVCache, meta: AttentionMetadata, rows: Rows) -> torch.Tensor:
        """One forward step and the logits of `rows` of its hidden states ((0, 0) when `rows` is empty).

        The unit the engine runs; under tensor parallelism rank 0 announces it first and the other ranks
        run the same call (`strata.parallel.follower`), so their collectives pair up.
        """
        if self.leader is None:
            return self._step(ids, kv, meta, rows)
        self.leader.announce(ids, kv, meta, rows)
        try:
            return self._step(ids, kv, meta, rows)
        except BaseException:
            self.leader.abort()  # the ranks are out of step now: end them rather than hang
            raise

    def _step(self, ids: torch.Tensor, kv: KVCache, meta: AttentionMetadata, rows: Rows) -> torch.Tensor:
        hidden = self(ids, kv, meta)
        if isinstance(rows, list) and not rows:
            return hidden.new_zeros(0, 0)
        return self.compute_logits(hidden[rows])
