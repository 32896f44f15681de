"""`ModelRunner`: one scheduled step as batch tensors over the paged KV cache, and its logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.engine.kv_cache import AttentionMetadata, KVCache
from strata.engine.sequence import Sequence
from strata.models.base import DecoderModel


@dataclass(frozen=True)
class ScheduledBatch:
    """What the scheduler chose for one step: each sequence and how many of its tokens to compute.

    A decoding sequence computes 1 token; a prefilling one a chunk of its prompt.
    """

    seqs: tuple[Sequence, ...]
    num_new_tokens: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


@dataclass(frozen=True)
class RunnerOutput:
    """Next-token logits for the sequences whose every token is now computed (the rest were mid-prefill)."""

    seqs: tuple[Sequence, ...]
    logits: torch.Tensor  # (len(seqs), vocab) float32


def slots_of(block_table: list[int], block_size: int, start: int, end: int) -> torch.Tensor:
    """(end - start,) KV slots of positions start..end-1 of a sequence with this block table."""
    positions = torch.arange(start, end)
    blocks = torch.tensor(block_table, dtype=torch.long)[positions // block_size]
    return blocks * block_size + positions % block_size


class ModelRunner:
    """Runs the model over a `ScheduledBatch`; the KV pool is `num_blocks * block_size` slots."""

    def __init__(self, model: DecoderModel, num_blocks: int, block_size: int) -> None:
        s = model.spec
        self.model, self.block_size = model, block_size
        self.kv = KVCache(s.num_layers, num_blocks * block_size, s.num_kv_heads, s.head_dim, model.dtype)

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, AttentionMetadata]:
        ids, positions, slot_mapping, contexts = [], [], [], []
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            ids.extend(seq.token_ids[start:end])
            positions.append(torch.arange(start, end))
            context = slots_of(seq.block_table, self.block_size, 0, end)
            slot_mapping.append(context[start:end])
            contexts.append(context)
        meta = AttentionMetadata(
            positions=torch.cat(positions),
            slot_mapping=torch.cat(slot_mapping),
            query_lens=batch.num_new_tokens,
            context_slots=tuple(contexts),
        )
        return torch.tensor(ids, dtype=torch.long), meta

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> RunnerOutput:
        """Compute the batch's tokens (their K/V land in the pool) and the logits that are due."""
        ids, meta = self.prepare(batch)
        hidden = self.model(ids, self.kv, meta)
        rows, due = [], []
        end = 0
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            end += n
            if seq.num_computed_tokens + n == seq.num_tokens:
                rows.append(end - 1)
                due.append(seq)
        logits = self.model.compute_logits(hidden[rows]) if rows else hidden.new_zeros(0, 0)
        return RunnerOutput(tuple(due), logits)
