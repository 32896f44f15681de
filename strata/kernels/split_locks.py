"""The split-K counters that the matvec and matmul kernels' last split of a row tile counts in
(`_bits.sum_splits`): zero between launches, one set per device and stream."""

from __future__ import annotations

import torch

_LOCKS: dict[tuple[torch.device, int], list[torch.Tensor]] = {}


def split_locks(device: torch.device, tiles: int) -> torch.Tensor:
    """The split-K counters of the device's current stream, one per row tile, all zero between
    launches (each launch's last split resets its own). One set serves every launch on a stream (they
    run one after another); launches on other streams, which may run alongside, get their own. A call
    needing more tiles gets a larger set, and the smaller ones stay allocated: a CUDA graph captured
    with one keeps its address."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    sets = _LOCKS.setdefault((device, stream), [])
    if not sets or sets[-1].numel() < tiles:
        sets.append(torch.zeros(max(tiles, 4096), dtype=torch.int32, device=device))
    return sets[-1]
