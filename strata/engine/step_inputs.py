"""A captured decode step's inputs in one buffer, so that a step uploads them with one copy.

The graphs read fixed tensors: token ids, positions and KV slots (int64), context lengths and block
tables (int32). Here they are views of one int32 buffer on the device, with a twin in pinned host
memory: a step fills the host twin with numpy and copies the words it uses in one asynchronous
transfer (five copies from pageable memory before, each a synchronous staging copy on the host).
Before the host twin is written again, the previous transfer must have read it: an event says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class StepViews:
    """Views of one buffer: `ids`, `positions`, `slots` (n,), `context_lens` (n,), `block_tables`
    (n, max_blocks)."""

    ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor

    @staticmethod
    def of(words: torch.Tensor, n: int, max_blocks: int) -> StepViews:
        # The int64 parts first: at offset 0 and in whole pairs of words, they stay 8-byte aligned.
        longs = words[: 6 * n].view(torch.int64)
        return StepViews(
            longs[:n],
            longs[n : 2 * n],
            longs[2 * n :],
            words[6 * n : 7 * n],
            words[7 * n :].view(n, max_blocks),
        )


class TwinWords:
    """An int32 buffer on a device (`.device`) and its twin in host memory (`.host`, pinned where the
    device is a GPU): the host fills the twin, `send` copies a prefix of it asynchronously."""

    def __init__(self, words: int, device: torch.device) -> None:
        pinned = device.type == "cuda"
        self.host = torch.zeros(words, dtype=torch.int32, pin_memory=pinned)
        self.device = torch.zeros(words, dtype=torch.int32, device=device)  # on the CPU too (tests)
        self._copied = torch.cuda.Event() if pinned else None

    def wait(self) -> None:
        """Block until the last `send` has read the host twin, so that it may be written again."""
        if self._copied is not None:
            self._copied.synchronize()

    def send(self, end: int) -> None:
        """Enqueue the copy of words [0, end) on the current stream."""
        self.device[:end].copy_(self.host[:end], non_blocking=True)
        if self._copied is not None:
            self._copied.record()


def words_needed(n: int, max_blocks: int) -> int:
    """int32 words for n rows: three int64 vectors, the context lengths and the block tables."""
    return 7 * n + n * max_blocks


class StepInputs:
    """Inputs of decode steps of up to `n` rows over block tables of `max_blocks` columns, on
    `device` (`device_views`, read by the graphs) and in host memory (pinned where `device` is a GPU).
    Rows start as padding: token 0 at position 0 writing `scratch_slot`, its table all
    `scratch_block`."""

    def __init__(self, n: int, max_blocks: int, device: torch.device, scratch_block: int, block_size: int):
        self.n, self.max_blocks = n, max_blocks
        self.scratch_block, self.scratch_slot = scratch_block, scratch_block * block_size
        self._words = TwinWords(words_needed(n, max_blocks), device)
        self.host_views = StepViews.of(self._words.host, n, max_blocks)
        self._host = {name: getattr(self.host_views, name).numpy() for name in StepViews.__dataclass_fields__}
        self._host["slots"][:] = self.scratch_slot
        self._host["context_lens"][:] = 1
        self._host["block_tables"][:] = scratch_block
        self._words.send(self._words.host.numel())
        self.device_views = StepViews.of(self._words.device, n, max_blocks)

    def upload(
        self, size: int, ids: list[int], positions: list[int], slots: list[int], block_tables: list[list[int]]
    ) -> None:
        """Write one step's inputs for rows 0 .. size - 1 (the rows past the batch padding) and
        enqueue their copy on the current stream. Columns past a row's table keep stale entries,
        which attention never reads (they lie past its context)."""
        batch = len(ids)
        if not 0 < batch <= size <= self.n:
            raise ValueError(f"a step of {batch} rows needs 0 < rows <= size <= {self.n}, got size {size}")
        self._words.wait()
        host = self._host
        host["ids"][:batch], host["ids"][batch:size] = ids, 0
        host["positions"][:batch], host["positions"][batch:size] = positions, 0
        host["slots"][:batch], host["slots"][batch:size] = slots, self.scratch_slot
        np.add(host["positions"][:size], 1, out=host["context_lens"][:size], casting="unsafe")
        tables = host["block_tables"]
        for row, table in enumerate(block_tables):
            tables[row, : len(table)] = table
        tables[batch:size, 0] = self.scratch_block
        end = words_needed(self.n, 0) + size * self.max_blocks  # rows 0 .. size - 1 of the tables
        self._words.send(end)
