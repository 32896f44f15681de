"""Prefill and mixed steps captured as CUDA graphs at fixed token counts, replayed with each step's
inputs (`EngineConfig.prefill_graph_tokens`; the bench's arm option `prefill_graphs=0` turns them off).

Launched one by one from Python, a step's kernels cost about 80 us of host time each on the GPU
machine (H100, 2026-12-06): the 7B's prefill of 512 tokens took 38-58 ms against 17.5 ms of kernels,
so below a few thousand tokens a prefill waits on the host, not the GPU. A graph replays the step's
kernels with one call, as the decode graphs (`cuda_graphs`) do for decode steps. Measured (H100,
2026-12-06, `strata bench ab strata:prefill_graphs=0 strata`): the 0.5B's prefill of 2,048 tokens
4.27x, of 512 7.1x, the 7B's of 512 1.43x, with the same token ids.

A step of n sequences and R tokens runs the graph captured for the smallest T >= R tokens and S >= n
+ 1 sequences. Its inputs are padded: the rows R .. T - 1 form one more sequence (token 0 at positions
0 .. T - R - 1, its K/V written to the scratch slot, its block table all the scratch block), so every
row the graph computes is finite and attends only to padding; sequences past it are empty. Each
graph also computes S rows of logits; the due ones come first. The prefill attention kernel takes its
query and context lengths from the device (its grid is sized by T), so the graph holds for any
split of the T rows into sequences.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from strata.engine.cuda_graphs import capture_graph
from strata.engine.kv_cache import AttentionMetadata, KVCache, PagedPrefill, slots_of
from strata.engine.step_inputs import TwinWords
from strata.models.base import DecoderModel

DEFAULT_TOKEN_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048)
# One sequence's part of a step: its new token ids, the position of the first, its block table.
NewTokens = tuple[list[int], int, list[int]]


class PrefillInputs:
    """One step's inputs for up to `tokens` rows and `seqs` sequences (the padding one included), in
    one buffer uploaded with one copy. Device views: `ids`, `positions`, `slots` (tokens,) int64,
    `logit_rows` (seqs,) int64, `context_lens` (seqs,), `query_start` (seqs + 1,) and `block_tables`
    (seqs, max_blocks) int32."""

    def __init__(
        self,
        tokens: int,
        seqs: int,
        max_blocks: int,
        device: torch.device,
        scratch_block: int,
        block_size: int,
    ) -> None:
        self.tokens, self.seqs, self.max_blocks, self.block_size = tokens, seqs, max_blocks, block_size
        self.scratch_block, self.scratch_slot = scratch_block, scratch_block * block_size
        longs = 3 * tokens + seqs
        self._tables_at = 2 * longs + 2 * seqs + 1
        self._words = TwinWords(self._tables_at + seqs * max_blocks, device)
        self.host = self._views(self._words.host)
        self.device = self._views(self._words.device)

    def _views(self, words: torch.Tensor) -> dict[str, torch.Tensor]:
        t, s = self.tokens, self.seqs
        longs = words[: 2 * (3 * t + s)].view(torch.int64)  # first: 8-byte aligned
        ints = words[2 * (3 * t + s) :]
        return {
            "ids": longs[:t],
            "positions": longs[t : 2 * t],
            "slots": longs[2 * t : 3 * t],
            "logit_rows": longs[3 * t :],
            "context_lens": ints[:s],
            "query_start": ints[s : 2 * s + 1],
            "block_tables": words[self._tables_at :].view(s, self.max_blocks),
        }

    def upload(self, size: tuple[int, int], seqs: Sequence[NewTokens], due: list[int]) -> None:
        """Write one step padded to `size` = (tokens T, sequences S) and enqueue its copy. `seqs`: each
        sequence's new tokens (its block table covers its context); `due`: the step rows whose logits
        are wanted, in order."""
        tokens, cap = size
        total = sum(len(ids) for ids, _, _ in seqs)
        if not (len(seqs) < cap <= self.seqs and total <= tokens <= self.tokens and len(due) <= cap):
            raise ValueError(
                f"a step of {len(seqs)} sequences and {total} tokens needs a size of more sequences and at "
                f"least as many tokens, within ({self.tokens}, {self.seqs}); got ({tokens}, {cap})"
            )
        self._words.wait()  # the last step's copy has read the host words
        h = {name: view.numpy() for name, view in self.host.items()}
        row = 0
        for b, (ids, start, table) in enumerate(seqs):
            end = row + len(ids)
            h["ids"][row:end] = ids
            h["positions"][row:end] = np.arange(start, start + len(ids))
            h["slots"][row:end] = slots_of(table, self.block_size, start, start + len(ids)).numpy()
            h["query_start"][b], h["context_lens"][b] = row, start + len(ids)
            h["block_tables"][b, : len(table)] = table
            row = end
        pad, n = tokens - row, len(seqs)
        h["ids"][row:tokens] = 0
        h["positions"][row:tokens] = np.arange(pad)
        h["slots"][row:tokens] = self.scratch_slot
        h["query_start"][n], h["context_lens"][n] = row, pad
        h["block_tables"][n, : -(-pad // self.block_size)] = self.scratch_block
        h["query_start"][n + 1 : cap + 1], h["context_lens"][n + 1 : cap] = tokens, 0
        h["logit_rows"][: len(due)], h["logit_rows"][len(due) : cap] = due, 0
        self._words.send(self._tables_at + (n + 1) * self.max_blocks)

    def metadata(self, size: tuple[int, int]) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
        """The token ids, attention metadata and logit rows that a graph of `size` reads."""
        tokens, cap = size
        d = self.device
        tables, lens, starts = d["block_tables"][:cap], d["context_lens"][:cap], d["query_start"][: cap + 1]
        paged = PagedPrefill(tables, lens, starts, self.block_size, tokens)
        meta = AttentionMetadata(d["positions"][:tokens], d["slots"][:tokens], (), (), paged_prefill=paged)
        return d["ids"][:tokens], meta, d["logit_rows"][:cap]


def prefill_tokens(sizes: Sequence[int], budget: int) -> tuple[int, ...]:
    """The token counts worth capturing when a step holds at most `budget` tokens (the scheduler's
    max_num_batched_tokens): those below it and the smallest one that holds it."""
    ordered = sorted(set(sizes))
    cover = next((t for t in ordered if t >= budget), None)
    return tuple(t for t in ordered if t < budget or t == cover)


def graph_sizes(token_sizes: Sequence[int], max_seqs: int) -> list[tuple[int, int]]:
    """(tokens, sequences) of every graph: for each token count T, room for one sequence and for
    min(max_seqs, T) sequences, each plus the padding one; largest first."""
    if not token_sizes or min(token_sizes) < 1 or max_seqs < 1:
        raise ValueError(f"token sizes and max_seqs must be positive; got {tuple(token_sizes)}, {max_seqs}")
    sizes = {(t, s + 1) for t in token_sizes for s in (1, min(max_seqs, t))}
    return sorted(sizes, reverse=True)


class PrefillGraphs:
    """Captured non-decode steps over `kv` at `token_sizes` tokens, up to `max_seqs` sequences a step;
    `scratch_block` is a block the block manager never hands out. `capture=False` (tests on the CPU)
    runs each step's body eagerly on the same padded inputs instead of replaying a graph."""

    def __init__(
        self,
        model: DecoderModel,
        kv: KVCache,
        block_size: int,
        max_blocks: int,
        scratch_block: int,
        token_sizes: Sequence[int] = DEFAULT_TOKEN_SIZES,
        max_seqs: int = 64,
        capture: bool = True,
    ) -> None:
        self.model, self.kv, self.capture = model, kv, capture
        self.sizes = graph_sizes(token_sizes, max_seqs)
        tokens, seqs = self.sizes[0][0], max(s for _, s in self.sizes)
        self.inputs = PrefillInputs(tokens, seqs, max_blocks, model.device, scratch_block, block_size)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if capture:
            pool = torch.cuda.graph_pool_handle()
            for size in self.sizes:  # largest first: the smaller graphs fit in the memory it reserved
                self.graphs[size] = self._capture(size, pool)

    def size_for(self, tokens: int, seqs: int) -> tuple[int, int] | None:
        """The smallest graph that holds a step of `tokens` rows and `seqs` sequences, if one does."""
        fits = [(t, s) for t, s in self.sizes if t >= tokens and s > seqs]
        return min(fits) if fits else None

    def _body(self, size: tuple[int, int]) -> torch.Tensor:
        ids, meta, rows = self.inputs.metadata(size)
        hidden = self.model(ids, self.kv, meta)
        return self.model.compute_logits(hidden.index_select(0, rows))

    def _capture(self, size: tuple[int, int], pool: object) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # The buffers hold padding: every row writes the scratch slot and attends to the scratch block.
        self.inputs.upload(size, [], [])
        return capture_graph(lambda: self._body(size), pool)

    @torch.inference_mode()
    def run(self, size: tuple[int, int], seqs: Sequence[NewTokens], due: list[int]) -> torch.Tensor:
        """(len(due), vocab) float32 logits of one step (see `PrefillInputs.upload`) run in the graph
        of `size` (`size_for`). Captured, the result is a view into the graph's output: read it before
        the next step."""
        self.inputs.upload(size, seqs, due)
        if not self.capture:
            return self._body(size)[: len(due)]
        graph, logits = self.graphs[size]
        graph.replay()
        return logits[: len(due)]
