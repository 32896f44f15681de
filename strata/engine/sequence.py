"""Engine-side state of one request: its tokens, KV block table and progress."""

from __future__ import annotations

import itertools
from enum import Enum, auto

from strata.engine.request import Request


class SequenceStatus(Enum):
    WAITING = auto()  # not yet allocated
    RUNNING = auto()  # holds blocks
    PREEMPTED = auto()  # lost its blocks; waits to be recomputed from its tokens
    FINISHED = auto()


class Sequence:
    """The engine resources of one request.

    `token_ids` are the tokens whose KV must exist: the prompt, then every generated token. The KV of
    `token_ids[:num_computed_tokens]` is written in the blocks of `block_table`; the first
    `num_cached_tokens` of those came from the prefix cache when the sequence was allocated.
    Results (output ids, finish reason, cache statistics) live on `request`.
    """

    _counter = itertools.count()

    def __init__(self, request: Request) -> None:
        self.seq_id: int = next(Sequence._counter)
        self.request = request
        self.token_ids: list[int] = list(request.prompt_ids)
        self.num_prompt_tokens: int = len(self.token_ids)
        self.block_table: list[int] = []
        self.num_computed_tokens: int = 0
        self.num_cached_tokens: int = 0
        self.num_preemptions: int = 0
        self.status = SequenceStatus.WAITING

    def __repr__(self) -> str:
        return (
            f"Sequence(seq_id={self.seq_id}, request={self.request.request_id!r}, status={self.status.name}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, blocks={self.block_table})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def num_blocks(self, block_size: int) -> int:
        """Blocks needed to hold the KV of every token in `token_ids`."""
        return (self.num_tokens + block_size - 1) // block_size

    def append_token(self, token_id: int) -> None:
        """Add a sampled token; the next step computes its KV. Results are recorded on the request."""
        self.token_ids.append(token_id)

    def reset_for_recompute(self) -> None:
        """Forget the KV after preemption (the blocks must already be freed).

        The generated tokens stay: recompute prefills prompt + generated so far, which reproduces the
        KV exactly, and decoding continues from there without resampling anything.
        """
        assert not self.block_table, "free the sequence's blocks before resetting it"
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.num_preemptions += 1
        self.status = SequenceStatus.PREEMPTED
