"""`ModelRunner`: one scheduled step as batch tensors over the paged KV cache, and its logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.engine.cuda_graphs import DEFAULT_BATCH_SIZES, DecodeGraphs, ShortGraphs, paged_decode
from strata.engine.kv_cache import AttentionMetadata, KVCache, PagedPrefill, slot_of, slots_of
from strata.engine.prefill_graphs import NewTokens, PrefillGraphs
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

    @property
    def is_decode(self) -> bool:
        return all(n == 1 for n in self.num_new_tokens)


@dataclass(frozen=True)
class RunnerOutput:
    """Next-token logits for the sequences whose every token is now computed (the rest were mid-prefill)."""

    seqs: tuple[Sequence, ...]
    logits: torch.Tensor  # (len(seqs), vocab) float32


def _decode_inputs(seqs: tuple[Sequence, ...], block_size: int) -> tuple[list[int], list[int], list[int]]:
    """Token ids, positions and KV slots of a decode step (each sequence's one uncomputed token)."""
    ids, positions, slots = [], [], []
    for seq in seqs:
        pos = seq.num_computed_tokens
        ids.append(seq.token_ids[pos])
        positions.append(pos)
        slots.append(slot_of(seq.block_table, block_size, pos))
    return ids, positions, slots


def _new_tokens(batch: ScheduledBatch) -> list[NewTokens]:
    """Each sequence's new token ids, the position of the first and its block table."""
    news = []
    for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        start = seq.num_computed_tokens
        news.append((seq.token_ids[start : start + n], start, seq.block_table))
    return news


def _due_rows(batch: ScheduledBatch) -> tuple[list[int], tuple[Sequence, ...]]:
    """The sequences whose prompt is done after this step (their next-token logits are due) and the
    step row of each one's last token. A one-token step can also be a prefill chunk with more to come."""
    rows, due = [], []
    end = 0
    for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        end += n
        if seq.num_computed_tokens + n == seq.num_tokens:
            rows.append(end - 1)
            due.append(seq)
    return rows, tuple(due)


class ModelRunner:
    """Runs the model over a `ScheduledBatch`; the KV pool is `num_blocks * block_size` slots.

    On the kernel path decode steps read K/V through block tables (the paged attention kernel); on a
    GPU they replay captured CUDA graphs when `cuda_graphs` is on and the batch fits the largest size.
    Other steps (prefill, mixed) go through the paged prefill kernel when `prefill_kernel` is on, else
    the torch reference over per-sequence slot lists; with the kernel, a GPU and `prefill_graph_tokens`
    they replay graphs captured at those token counts (for up to `max_seqs` sequences a step) when one
    holds the step, and run eagerly otherwise.
    """

    def __init__(
        self,
        model: DecoderModel,
        num_blocks: int,
        block_size: int,
        cuda_graphs: bool = True,
        graph_batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
        prefill_kernel: bool = False,
        prefill_graph_tokens: tuple[int, ...] = (),
        max_seqs: int = 64,
    ) -> None:
        s = model.spec
        self.model, self.block_size, self.device = model, block_size, model.device
        self.kernels, self.prefill_kernel = model.place.kernels, prefill_kernel
        # One block past the pool: the scratch block that padding rows of a captured batch write to.
        slots = (num_blocks + 1) * block_size
        # Under tensor parallelism each rank's pool holds only its own KV heads.
        kv_heads = model.place.tp.local(s.num_kv_heads)
        self.kv = KVCache(s.num_layers, slots, kv_heads, s.head_dim, model.dtype, model.device)
        self.max_blocks = -(-s.context_length // block_size)
        self.short = ShortGraphs.from_env()  # a second set of decode graphs for short contexts
        self.graphs: DecodeGraphs | None = None
        # Not yet with tensor parallelism: capturing the collectives (and replaying them on every rank
        # in step) is unwritten, so those decode steps run eagerly.
        graphs = cuda_graphs and self.device.type == "cuda" and model.place.tp.size == 1
        if graphs:
            self.graphs = DecodeGraphs(
                model, self.kv, block_size, self.max_blocks, num_blocks, graph_batch_sizes, self.short
            )
        self.prefill_graphs: PrefillGraphs | None = None
        if graphs and self.kernels and prefill_kernel and prefill_graph_tokens:
            self.prefill_graphs = PrefillGraphs(
                model, self.kv, block_size, self.max_blocks, num_blocks, prefill_graph_tokens, max_seqs
            )

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, AttentionMetadata]:
        if self.kernels and batch.is_decode:
            return self._prepare_paged_decode(batch)
        if self.kernels and self.prefill_kernel:
            return self._prepare_paged_prefill(batch)
        ids, positions, slot_mapping, contexts = [], [], [], []
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            ids.extend(seq.token_ids[start:end])
            positions.append(torch.arange(start, end))
            context = slots_of(seq.block_table, self.block_size, 0, end)
            slot_mapping.append(context[start:end])
            contexts.append(context.to(self.device))
        meta = AttentionMetadata(
            positions=torch.cat(positions).to(self.device),
            slot_mapping=torch.cat(slot_mapping).to(self.device),
            query_lens=batch.num_new_tokens,
            context_slots=tuple(contexts),
        )
        return torch.tensor(ids, dtype=torch.long, device=self.device), meta

    def _block_tables(self, seqs: tuple[Sequence, ...]) -> torch.Tensor:
        width = max(len(seq.block_table) for seq in seqs)
        tables = [seq.block_table + [0] * (width - len(seq.block_table)) for seq in seqs]
        return torch.tensor(tables, dtype=torch.int32, device=self.device)

    def _prepare_paged_prefill(self, batch: ScheduledBatch) -> tuple[torch.Tensor, AttentionMetadata]:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[torch.Tensor] = []
        starts = [0]
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.append(slots_of(seq.block_table, self.block_size, start, end))
            starts.append(starts[-1] + n)
        paged = PagedPrefill(
            block_tables=self._block_tables(batch.seqs),
            context_lens=torch.tensor(
                [s.num_computed_tokens + n for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)],
                dtype=torch.int32,
                device=self.device,
            ),
            query_start=torch.tensor(starts, dtype=torch.int32, device=self.device),
            block_size=self.block_size,
            max_query_len=max(batch.num_new_tokens),
        )
        meta = AttentionMetadata(
            positions=torch.tensor(positions, dtype=torch.long, device=self.device),
            slot_mapping=torch.cat(slots).to(self.device),
            query_lens=batch.num_new_tokens,
            context_slots=(),
            paged_prefill=paged,
        )
        return torch.tensor(ids, dtype=torch.long, device=self.device), meta

    def _prepare_paged_decode(self, batch: ScheduledBatch) -> tuple[torch.Tensor, AttentionMetadata]:
        ids, positions, slots = _decode_inputs(batch.seqs, self.block_size)
        max_positions = self.max_blocks * self.block_size
        lens = torch.tensor([p + 1 for p in positions], dtype=torch.int32, device=self.device)
        is_short = self.short.serves(max(positions) + 1, max_positions)
        tables = self._block_tables(batch.seqs)
        paged = paged_decode(tables, lens, self.block_size, max_positions, self.short, is_short)
        meta = AttentionMetadata(
            positions=torch.tensor(positions, dtype=torch.long, device=self.device),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=self.device),
            query_lens=batch.num_new_tokens,
            context_slots=(),
            paged=paged,
        )
        return torch.tensor(ids, dtype=torch.long, device=self.device), meta

    def can_run_ahead(self, batch: ScheduledBatch) -> bool:
        """Whether `argmax_steps` can run this batch: a decode step of sequences whose every token but
        the last is computed, within the captured graphs."""
        fits = self.graphs is not None and len(batch.seqs) <= self.graphs.max_batch
        return fits and all(seq.num_computed_tokens + 1 == seq.num_tokens for seq in batch.seqs)

    @torch.inference_mode()
    def argmax_steps(self, batch: ScheduledBatch, steps: int) -> list[list[int]]:
        """`steps` decode steps of the batch (`can_run_ahead`) run back to back, each step's input the
        argmax of the one before, picked and fed on the device; each sequence's block table must cover
        `steps` more positions. Returns each step's tokens (steps x sequences), read with one wait."""
        assert self.graphs is not None
        ids, positions, _ = _decode_inputs(batch.seqs, self.block_size)
        tables = [seq.block_table for seq in batch.seqs]
        picks = torch.empty(steps, len(ids), dtype=torch.long, device=self.device)
        for j in range(steps):
            at = [p + j for p in positions]
            slots = [slot_of(t, self.block_size, p) for t, p in zip(tables, at, strict=True)]
            logits = self.graphs.run(ids, at, slots, tables, picks[j - 1] if j else None)
            torch.argmax(logits, dim=-1, out=picks[j])
        return picks.tolist()

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> RunnerOutput:
        """Compute the batch's tokens (their K/V land in the pool) and the logits that are due."""
        rows, due = _due_rows(batch)
        if self.graphs is not None and batch.is_decode and len(batch.seqs) <= self.graphs.max_batch:
            ids, positions, slots = _decode_inputs(batch.seqs, self.block_size)
            logits = self.graphs.run(ids, positions, slots, [seq.block_table for seq in batch.seqs])
            # One token per sequence, so rows index sequences; all due is the common case: no copy.
            return RunnerOutput(due, logits if len(rows) == len(batch.seqs) else logits[rows])
        if self.prefill_graphs is not None and not batch.is_decode:
            size = self.prefill_graphs.size_for(batch.num_tokens, len(batch.seqs))
            if size is not None:
                return RunnerOutput(due, self.prefill_graphs.run(size, _new_tokens(batch), rows))
        ids_t, meta = self.prepare(batch)
        return RunnerOutput(due, self.model.step(ids_t, self.kv, meta, rows))
