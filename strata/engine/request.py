"""What a caller asked for and what it got back: one generation request, free of engine resources."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from strata.engine.sampler import SamplingParams

FinishReason = Literal["stop", "length", "abort", "error"]

_arrival_order = itertools.count()


@dataclass(eq=False)
class Request:
    """One generation request and its results.

    A Request never holds KV blocks: those belong to its `Sequence`, which the engine creates, preempts
    and frees. The result fields are written by the engine: `output_ids` grows as tokens are sampled
    (so it can be streamed), `finish_reason` is set once at the end; `cached_tokens` and
    `cache_miss_position` by the block manager at the first allocation.

    Ordering: lower `priority` runs first; within a priority, first come first served (`sort_key`).
    """

    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)

    output_ids: list[int] = field(default_factory=list, init=False)
    finish_reason: FinishReason | None = field(default=None, init=False)
    cached_tokens: int = field(default=0, init=False)  # prompt tokens served from the prefix cache
    # First prompt position that differed from the best cached match; None when every prompt token
    # matched, or when there was nothing to compare against (cache empty or disabled).
    cache_miss_position: int | None = field(default=None, init=False)
    error: str | None = field(default=None, init=False)
    # Breaks arrival_time ties (coarse clocks) in submission order.
    arrival_order: int = field(default_factory=lambda: next(_arrival_order), init=False, repr=False)

    def __post_init__(self) -> None:
        self.prompt_ids = tuple(self.prompt_ids)
        if not self.prompt_ids:
            raise ValueError(f"request {self.request_id!r} has an empty prompt; at least one token is needed")

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def sort_key(self) -> tuple[int, float, int]:
        """Scheduling order: smaller runs first."""
        return (self.priority, self.arrival_time, self.arrival_order)

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        """Record why generation ended; `error` carries the message when `reason` is "error"."""
        if reason not in get_args(FinishReason):
            raise ValueError(f"finish reason {reason!r} is not one of {get_args(FinishReason)}")
        if self.finish_reason is not None:
            raise RuntimeError(f"request {self.request_id!r} already finished ({self.finish_reason})")
        self.finish_reason = reason
        self.error = error
