"""What rank 0 sends the other ranks before each model step: plain, picklable host data."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from strata.engine.kv_cache import AttentionMetadata, PagedDecode, PagedPrefill


@dataclass(frozen=True)
class Step:
    """Run `model.step(ids, kv, meta, rows)` on the KV cache rank 0 calls `cache`.

    A follower keeps one cache per live cache of rank 0, each `num_slots` slots of its own KV heads,
    and drops those whose keys come in `freed` (rank 0 dropped them since the last step).
    """

    cache: int
    num_slots: int
    ids: torch.Tensor  # (num_tokens,) on the CPU
    meta: AttentionMetadata  # tensors on the CPU
    rows: list[int] | slice
    freed: tuple[int, ...] = ()


@dataclass(frozen=True)
class Stop:
    """Rank 0 is closing: the follower leaves the group and exits."""


Message = Step | Stop


def _moved(value: Any, device: torch.device | str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_moved(v, device) for v in value)
    if isinstance(value, PagedDecode | PagedPrefill):
        return replace(value, **{f.name: _moved(getattr(value, f.name), device) for f in fields(value)})
    return value


def metadata_to(meta: AttentionMetadata, device: torch.device | str) -> AttentionMetadata:
    """`meta` with every tensor on `device` (and no cached masks: the receiver builds its own)."""
    values = {f.name: _moved(getattr(meta, f.name), device) for f in fields(meta) if f.name != "_masks"}
    return AttentionMetadata(**values)
