"""The decode step captured as CUDA graphs, one per batch size (and, with STRATA_SHORT_GRAPHS, a
second set for short contexts), replayed with each step's inputs.

A decode step of a small model is hundreds of short kernels; launched one by one from Python, the
launches cost more than the kernels. A captured graph replays them all with one call. Its tensors
are fixed, so every step copies its inputs (token ids, positions, KV slots, block tables, context
lengths) into static buffers first (one transfer from pinned memory: `step_inputs`), and a batch of
b sequences runs the smallest captured size >= b, the extra rows padding: token 0 at position 0,
writing its K/V to a scratch slot outside the pool and attending only to that slot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from strata.engine.kv_cache import AttentionMetadata, KVCache, PagedDecode
from strata.engine.step_inputs import StepInputs
from strata.models.base import DecoderModel

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)


def context_bound(max_context: int, max_positions: int, short: int) -> int:
    """The bound that decode attention splits a step's contexts by (`PagedDecode.max_context_len`):
    `short` where every context fits in it and it is below a sequence's most positions
    (STRATA_SHORT_GRAPHS), else those, so that a step splits alike with or without a captured graph."""
    return short if 0 < short < max_positions and max_context <= short else max_positions


@torch.inference_mode()
def capture_graph(
    body: Callable[[], torch.Tensor], pool: object
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`body` captured as a CUDA graph in memory `pool`, and the tensor it returns (the graph's output).
    Two warm-up runs first compile its Triton kernels (capture cannot compile), on a side stream, as
    capture requires."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):  # type: ignore[arg-type]
        out = body()
    return graph, out


class DecodeGraphs:
    """Captured decode steps over `kv`; `scratch_block` is a block the block manager never hands out.
    `short` (STRATA_SHORT_GRAPHS, 0 for none): a second set bounded by that many positions.
    `capture=False` (tests on the CPU) runs each step's body eagerly on the same buffers instead."""

    def __init__(
        self,
        model: DecoderModel,
        kv: KVCache,
        block_size: int,
        max_blocks: int,
        scratch_block: int,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
        short: int = 0,
        capture: bool = True,
    ) -> None:
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"batch_sizes must be positive sizes, got {tuple(batch_sizes)}")
        device = model.device
        self.sizes = sorted(set(batch_sizes))
        self.block_size, self.max_blocks, self.scratch_block = block_size, max_blocks, scratch_block
        self.inputs = StepInputs(self.sizes[-1], max_blocks, device, scratch_block, block_size)
        views = self.inputs.device_views
        self.ids, self.positions, self.slots = views.ids, views.positions, views.slots
        self.context_lens, self.block_tables = views.context_lens, views.block_tables
        self.max_positions, self.short = max_blocks * block_size, short
        bounds = {self.max_positions, context_bound(0, self.max_positions, self.short)}
        self.model, self.kv, self.capture = model, kv, capture
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if capture:
            pool = torch.cuda.graph_pool_handle()
            # Largest first, so the smaller graphs fit in the memory the largest one reserved.
            for size in reversed(self.sizes):
                for bound in sorted(bounds, reverse=True):
                    self.graphs[size, bound] = self._capture(size, bound, pool)

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def _metadata(self, size: int, bound: int) -> AttentionMetadata:
        paged = PagedDecode(self.block_tables[:size], self.context_lens[:size], self.block_size, bound)
        return AttentionMetadata(self.positions[:size], self.slots[:size], (1,) * size, (), paged=paged)

    def _body(self, size: int, bound: int) -> torch.Tensor:
        return self.model.compute_logits(self.model(self.ids[:size], self.kv, self._metadata(size, bound)))

    def _capture(self, size: int, bound: int, pool: object) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # The buffers hold padding, so the warm-up runs write only the scratch slot.
        return capture_graph(lambda: self._body(size, bound), pool)

    def run(
        self,
        ids: list[int],
        positions: list[int],
        slots: list[int],
        block_tables: list[list[int]],
        device_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(len(ids), vocab) float32 logits of one decode step; each sequence's block table covers its
        context (position + 1 tokens). `device_ids`, (len(ids),) int64 on the device, replace `ids`
        (copied in on the stream: a previous step's picks). The result is a view into the graph's
        output: read it before the next step."""
        batch = len(ids)
        size = next(s for s in self.sizes if s >= batch)
        bound = context_bound(max(positions) + 1, self.max_positions, self.short)
        self.inputs.upload(size, ids, positions, slots, block_tables)
        if device_ids is not None:
            self.ids[:batch].copy_(device_ids)
        if not self.capture:
            return self._body(size, bound)[:batch]
        graph, logits = self.graphs[size, bound]
        graph.replay()
        return logits[:batch]
