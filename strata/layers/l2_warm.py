"""STRATA_L2_WARM: a decode step asks L2 for the weights of the matvecs ahead while it runs a layer.

At the start of each block, a side stream of the step (a parallel branch of its CUDA graph) launches
`kernels.l2_warm.warm_l2` over the next `ahead` bytes of matvec weights in the order the step reads
them, from the block's second weight on (its first is being read at once). Each block's window starts
where the last one ended, so with `ahead` larger than a layer's weights every byte is asked for once,
a layer before it is read; with less, a block warms its own attention output and the start of its
feed-forward weights while its attention runs. The branch joins the step once, after the last block.
Nothing is written: the same values with or without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from strata.layers.linear import QuantLinear

Ranges = list[tuple[int, int]]  # (address, length in bytes)


def weight_ranges(module: nn.Module) -> list[Ranges]:
    """The bytes of each `QuantLinear` in `module` that a decode matvec reads (its packed planes, or
    its dense weight where it has no kernel), in module order, which the blocks' constructors keep in
    the order their forward runs them."""
    out: list[Ranges] = []
    for layer in module.modules():
        if not isinstance(layer, QuantLinear):
            continue
        tensors = list(layer.packed.planes) if layer.packed is not None else [layer.weight]
        out.append([(t.data_ptr(), t.numel() * t.element_size()) for t in tensors if t is not None])
    return out


def warm_windows(blocks: Sequence[list[Ranges]], tail: list[Ranges], ahead: int) -> list[Ranges]:
    """For each block, the ranges its warm asks for: `ahead` bytes of the weights read from its second
    weight on (its later weights, the later blocks', then `tail`'s: the output head), less what an
    earlier block's window already covered."""
    pieces: list[tuple[int, int, int]] = []  # (offset in the step's read order, address, length)
    starts, offset = [], 0
    for weights in [*blocks, tail]:
        starts.append(offset + sum(n for _, n in weights[0]) if weights else offset)
        for address, length in (r for w in weights for r in w):
            pieces.append((offset, address, length))
            offset += length
    windows, cursor = [], 0
    for start in starts[: len(blocks)]:
        lo, hi = max(cursor, start), start + ahead
        cursor = max(cursor, hi)
        windows.append(_slice(pieces, lo, hi))
    return windows


def _slice(pieces: list[tuple[int, int, int]], lo: int, hi: int) -> Ranges:
    """The address ranges of read-order offsets [lo, hi)."""
    out = []
    for offset, address, length in pieces:
        a, b = max(lo, offset), min(hi, offset + length)
        if a < b:
            out.append((address + a - offset, b - a))
    return out


class L2Warmer:
    """A model's warm windows as device tables, and the side stream that launches them."""

    def __init__(
        self, blocks: list[nn.Module], head: nn.Module, ahead: int, matvec_rows: int, device: torch.device
    ) -> None:
        from strata.kernels.l2_warm import chunk_table

        windows = warm_windows([weight_ranges(b) for b in blocks], weight_ranges(head), ahead)
        self.tables = [chunk_table(w, device) for w in windows]
        self.side = torch.cuda.Stream(device)
        self.matvec_rows = matvec_rows

    @classmethod
    def build(
        cls, blocks: Iterable[nn.Module], head: nn.Module, ahead: int, matvec_rows: int
    ) -> L2Warmer | None:
        """A warmer where it can run (`ahead` > 0, the weights on a CUDA GPU of compute capability
        9.0 or later: the bulk prefetch is Hopper's), else None."""
        blocks = list(blocks)
        device = next((p.device for b in blocks for p in b.parameters()), None)
        if ahead <= 0 or device is None or device.type != "cuda":
            return None
        if torch.cuda.get_device_capability(device) < (9, 0):
            return None
        return cls(blocks, head, ahead, matvec_rows, device)

    def applies(self, x: torch.Tensor) -> bool:
        """Whether a step of hidden states `x` warms: a decode step (rows a matvec takes)."""
        return x.is_cuda and x.shape[0] <= self.matvec_rows

    def ahead_of(self, block: int) -> None:
        """Before block `block` runs: its window, on the side stream once it has caught up with the
        step (so the branch starts at this point of the graph)."""
        from strata.kernels.l2_warm import warm_l2

        main = torch.cuda.current_stream(self.side.device)
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            warm_l2(self.tables[block])

    def join(self) -> None:
        """After the last block: the step waits for the branch (a graph's branches must rejoin)."""
        torch.cuda.current_stream(self.side.device).wait_stream(self.side)
