"""`Scheduler`: which sequences run this step, and how many tokens each computes.

Every step has a token budget (`max_num_batched_tokens`). Running sequences go first, in admission
order: a decoding one takes 1 token, one still prefilling takes the next chunk of its prompt. Then
waiting sequences are admitted by (priority, arrival) while the budget, the sequence limit and the
KV pool allow; a long prompt is prefilled over several steps. Admission needs the blocks for the
whole prompt plus a reservation of decode room, so it never over-commits; if decoding still runs out
of blocks, the newest running sequence is preempted: its blocks are freed and it is requeued to be
recomputed from its tokens so far, which yields the same output.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from strata.engine.block_manager import BlockManager
from strata.engine.model_runner import ScheduledBatch
from strata.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # chunked-prefill budget per step
    max_waiting: int = 1024  # beyond it add() refuses: the server answers 503 with Retry-After
    reserve_tokens: int = 16  # decode room a sequence must find free at admission

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_waiting"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} is {getattr(self, name)}; it must be at least 1")
        if self.reserve_tokens < 0:
            raise ValueError(f"reserve_tokens is {self.reserve_tokens}; it must be 0 or more")


class EngineBusy(RuntimeError):
    """The waiting queue is full; retry later."""


@dataclass(order=True)
class _Waiting:
    key: tuple[int, float, int]  # Request.sort_key: priority, arrival time, arrival order
    seq: Sequence = field(compare=False)


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager) -> None:
        self.config, self.blocks = config, blocks
        self._waiting: list[_Waiting] = []  # a heap by Request.sort_key
        self.running: list[Sequence] = []  # in admission order; the newest is preempted first
        self.num_preemptions = 0
        self.num_admissions = 0  # moves from waiting to running, re-admissions after preemption included
        self.exhausted: list[Sequence] = []  # outgrew the whole KV pool; the engine ends them

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def waiting(self) -> Iterator[Sequence]:
        return (w.seq for w in sorted(self._waiting))

    def add(self, seq: Sequence) -> None:
        if len(self._waiting) >= self.config.max_waiting:
            raise EngineBusy(
                f"{len(self._waiting)} requests are already waiting, the limit is "
                f"{self.config.max_waiting}; retry shortly"
            )
        self._push(seq)

    def _push(self, seq: Sequence) -> None:
        if seq.status is not SequenceStatus.PREEMPTED:
            seq.status = SequenceStatus.WAITING
        heapq.heappush(self._waiting, _Waiting(seq.request.sort_key, seq))

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence wherever it is and free its blocks (finish, abort, error)."""
        if seq in self.running:
            self.running.remove(seq)
        else:
            kept = [w for w in self._waiting if w.seq is not seq]
            if len(kept) != len(self._waiting):
                self._waiting = kept
                heapq.heapify(self._waiting)
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> ScheduledBatch:
        budget = self.config.max_num_batched_tokens
        seqs: list[Sequence] = []
        counts: list[int] = []
        for seq in list(self.running):
            if budget == 0:
                break
            if seq not in self.running:  # preempted by an earlier sequence of this loop
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._make_room(seq, n):
                continue
            seqs.append(seq)
            counts.append(n)
            budget -= n
        while self._waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self._waiting[0].seq
            # With nothing running, the reservation cannot be waited for: admit on what fits now (a
            # preempted sequence may have grown past pool - reserve), or end what never can fit.
            reserve = self.config.reserve_tokens if self.running else 0
            if not self.blocks.can_allocate(seq, reserve):
                if not self.running:
                    heapq.heappop(self._waiting)
                    self.exhausted.append(seq)
                    continue
                break  # FCFS: nothing jumps the head of the queue
            heapq.heappop(self._waiting)
            self.blocks.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self.num_admissions += 1
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            seqs.append(seq)
            counts.append(n)
            budget -= n
        return ScheduledBatch(tuple(seqs), tuple(counts))

    def _make_room(self, seq: Sequence, num_tokens: int) -> bool:
        """Blocks for `seq` to compute `num_tokens` more, preempting newer sequences if needed."""
        while not self.blocks.can_append(seq, num_tokens):
            if self.running == [seq]:
                # Alone and still out of blocks: the pool can never hold it; end it rather than spin.
                self.running.remove(seq)
                self.exhausted.append(seq)
                return False
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        self.blocks.append_slots(seq, num_tokens)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.reset_for_recompute()
        self.num_preemptions += 1
        self._push(seq)

    def finish_step(self, batch: ScheduledBatch) -> None:
        """The batch's tokens are computed: advance each sequence and publish its full blocks."""
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            self.blocks.mark_computed(seq, seq.num_computed_tokens + n)
