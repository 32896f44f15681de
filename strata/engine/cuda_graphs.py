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
from dataclasses import dataclass

import torch

from strata import env
from strata.engine.kv_cache import AttentionMetadata, KVCache, PagedDecode
from strata.engine.step_inputs import StepInputs
from strata.models.base import DecoderModel

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)


@dataclass(frozen=True)
class ShortGraphs:
    """The second set of decode graphs, for steps whose contexts all fit in `positions` (0: none;
    STRATA_SHORT_GRAPHS), and its attention launch (`env.short_attention`): at most `splits` a
    sequence, counted as for the long set (0: as many as a context of `positions` takes), `block_t`
    and `stages` (0: the long set's)."""

    positions: int = 0
    splits: int = 0
    block_t: int = 0
    stages: int = 0

    @classmethod
    def from_env(cls) -> ShortGraphs:
        return cls(env.short_graphs(), *env.short_attention())

    def serves(self, max_context: int, max_positions: int) -> bool:
        """Whether a step whose longest context is `max_context` runs the short set."""
        return 0 < self.positions < max_positions and max_context <= self.positions


def paged_decode(
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    max_positions: int,
    short: ShortGraphs,
    is_short: bool,
) -> PagedDecode:
    """How decode attention splits and tiles a step (the short set's launch or the pool's whole
    length), one rule for the captured graphs and the eager path, so that a step splits alike with or
    without a graph and its result never depends on whether its batch fit one."""
    if not is_short:
        return PagedDecode(block_tables, context_lens, block_size, max_positions)
    # With a cap the split count follows the long set's rule (many sequences take few splits).
    bound = max_positions if short.splits else short.positions
    return PagedDecode(
        block_tables, context_lens, block_size, bound, block_t=short.block_t, num_stages=short.stages,
        max_splits=short.splits,
    )  # fmt: skip


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
    `short`: a second set for short contexts (none by default).
    `capture=False` (tests on the CPU) runs each step's body eagerly on the same buffers instead."""

    def __init__(
        self,
        model: DecoderModel,
        kv: KVCache,
        block_size: int,
        max_blocks: int,
        scratch_block: int,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
        short: ShortGraphs = ShortGraphs(),
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
        variants = (False, True) if short.serves(0, self.max_positions) else (False,)
        self.model, self.kv, self.capture = model, kv, capture
        self.graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if capture:
            pool = torch.cuda.graph_pool_handle()
            # Largest first, so the smaller graphs fit in the memory the largest one reserved.
            for size in reversed(self.sizes):
                for is_short in variants:
                    self.graphs[size, is_short] = self._capture(size, is_short, pool)

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def _metadata(self, size: int, is_short: bool) -> AttentionMetadata:
        tables, lens = self.block_tables[:size], self.context_lens[:size]
        paged = paged_decode(tables, lens, self.block_size, self.max_positions, self.short, is_short)
        return AttentionMetadata(self.positions[:size], self.slots[:size], (1,) * size, (), paged=paged)

    def _body(self, size: int, is_short: bool) -> torch.Tensor:
        meta = self._metadata(size, is_short)
        return self.model.compute_logits(self.model(self.ids[:size], self.kv, meta))

    def _capture(self, size: int, is_short: bool, pool: object) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # The buffers hold padding, so the warm-up runs write only the scratch slot.
        return capture_graph(lambda: self._body(size, is_short), pool)

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
        is_short = self.short.serves(max(positions) + 1, self.max_positions)
        self.inputs.upload(size, ids, positions, slots, block_tables)
        if device_ids is not None:
            self.ids[:batch].copy_(device_ids)
        if not self.capture:
            return self._body(size, is_short)[:batch]
        graph, logits = self.graphs[size, is_short]
        graph.replay()
        return logits[:batch]
