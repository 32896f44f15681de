"""BlockManager bookkeeping: sharing, reference counts, the hash-chained prefix cache and LRU eviction."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from strata.engine.block_manager import BlockManager, OutOfBlocksError
from strata.engine.request import Request
from strata.engine.sequence import Sequence, SequenceStatus

SAMPLING: Any = object()  # the block manager never looks at sampling parameters


def make_seq(tokens: list[int] | range, request_id: str = "r") -> Sequence:
    return Sequence(Request(request_id, tuple(tokens), SAMPLING))


def prefill(bm: BlockManager, seq: Sequence) -> None:
    """Compute every token the sequence holds, as one prefill step would."""
    bm.append_slots(seq, seq.num_tokens - seq.num_computed_tokens)
    bm.mark_computed(seq, seq.num_tokens)


def admit(bm: BlockManager, tokens: list[int] | range, computed: bool = True) -> Sequence:
    seq = make_seq(tokens)
    bm.allocate(seq)
    if computed:
        prefill(bm, seq)
    bm.check_invariants()
    return seq


def test_shared_prefix_shares_blocks_and_counts_references() -> None:
    bm = BlockManager(8, 4)
    a = admit(bm, range(10))
    assert bm.num_cached_blocks == 2  # the partial third block is never cached
    b = admit(bm, [*range(8), 100, 101, 102], computed=False)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.blocks[i].ref_count for i in b.block_table] == [2, 2, 1]
    assert b.num_cached_tokens == b.num_computed_tokens == b.request.cached_tokens == 8
    assert b.request.cache_miss_position == 8
    bm.free(a)
    bm.check_invariants()
    assert [bm.blocks[i].ref_count for i in b.block_table] == [1, 1, 1]
    bm.free(b)
    bm.free(b)  # idempotent
    bm.check_invariants()
    assert bm.num_free_blocks == 8 and b.block_table == []


def test_blocks_are_cached_only_once_computed() -> None:
    bm = BlockManager(16, 4)
    a = admit(bm, range(10), computed=False)
    assert admit(bm, range(10), computed=False).num_cached_tokens == 0
    bm.append_slots(a, 6)
    bm.mark_computed(a, 6)  # one full block written, the second only half
    assert bm.num_cached_blocks == 1
    assert admit(bm, range(10), computed=False).num_cached_tokens == 4
    bm.mark_computed(a, 8)
    assert admit(bm, range(10), computed=False).num_cached_tokens == 8


def test_mark_computed_registers_even_when_the_count_was_already_advanced() -> None:
    bm = BlockManager(8, 4)
    a = admit(bm, range(9), computed=False)
    a.num_computed_tokens = 9
    bm.mark_computed(a, 9)
    bm.mark_computed(a, 9)
    bm.check_invariants()
    assert bm.num_cached_blocks == 2


def test_same_block_after_a_different_prefix_does_not_hit() -> None:
    bm = BlockManager(8, 4)
    admit(bm, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = admit(bm, [9, 9, 9, 9, 5, 6, 7, 8, 9], computed=False)
    assert b.num_cached_tokens == 0 and b.request.cache_miss_position == 0


@pytest.mark.parametrize(
    ("prompt", "cached", "miss"),
    [
        ([0, 1, 2, 3, 4, 5, 99, 98, 97], 4, 6),  # diverges inside the second block
        ([0, 1, 2, 3, 4, 5, 6, 7, 99, 98], 8, 8),  # diverges at a block start
        ([0, 1, 2, 3, 4, 5, 6, 60, 61], 4, 7),  # the best of two candidate blocks counts
        ([0, 1, 2, 3, 4, 5], 4, None),  # a partial last block that agrees: no divergence, no hit
        ([50, 1, 2, 3, 4], 0, 0),
    ],
)
def test_cache_miss_position_is_exact(prompt: list[int], cached: int, miss: int | None) -> None:
    bm = BlockManager(16, 4)
    admit(bm, range(13))
    admit(bm, [0, 1, 2, 3, 4, 5, 50, 51, 52])
    seq = admit(bm, prompt, computed=False)
    assert (seq.request.cached_tokens, seq.request.cache_miss_position) == (cached, miss)


def test_cache_miss_position_is_none_without_a_cache() -> None:
    assert admit(BlockManager(8, 4), range(9)).request.cache_miss_position is None
    bm = BlockManager(8, 4, enable_prefix_cache=False)
    admit(bm, range(9))
    seq = admit(bm, range(9))
    assert (seq.request.cached_tokens, seq.request.cache_miss_position) == (0, None)


def test_whole_prompt_hit_still_computes_the_last_block() -> None:
    bm = BlockManager(8, 4)
    a = admit(bm, range(8))
    b = admit(bm, range(8), computed=False)
    assert b.num_computed_tokens == b.request.cached_tokens == 4
    assert b.request.cache_miss_position is None
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]
    prefill(bm, b)  # writes only its private last block
    bm.check_invariants()
    assert admit(bm, range(4), computed=False).num_computed_tokens == 0


def test_lru_evicts_least_recently_freed_first() -> None:
    bm = BlockManager(5, 4)
    a, b = admit(bm, range(5)), admit(bm, range(10, 15))
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 5 and bm.num_cached_blocks == 2
    bm.free(admit(bm, range(100, 116), computed=False))  # takes the three free blocks, then evicts a's
    assert bm.num_cached_blocks == 1
    assert admit(bm, range(5), computed=False).num_cached_tokens == 0
    assert admit(bm, range(10, 15), computed=False).num_cached_tokens == 4


def test_a_freed_prefix_loses_its_tail_first_and_a_hit_refreshes_it() -> None:
    bm = BlockManager(4, 4)
    bm.free(admit(bm, range(12)))
    # The first filler takes the free block, the second evicts the least recently used one: a's tail.
    fillers = [admit(bm, [7], computed=False), admit(bm, [8], computed=False)]
    for seq in fillers:
        bm.free(seq)
    assert admit(bm, [*range(12), 99], computed=False).num_cached_tokens == 8

    bm = BlockManager(4, 4)
    bm.free(admit(bm, [0, 1, 2, 3, 4]))
    bm.free(admit(bm, [10, 11, 12, 13, 14]))
    bm.free(admit(bm, [0, 1, 2, 3, 99], computed=False))  # a hit on [0..3] makes it the newest
    fillers = [admit(bm, [t], computed=False) for t in (5, 6, 7)]  # two free blocks, then the oldest
    for seq in fillers:
        bm.free(seq)
    assert admit(bm, [10, 11, 12, 13, 98], computed=False).num_cached_tokens == 0
    assert admit(bm, [0, 1, 2, 3, 98], computed=False).num_cached_tokens == 4


def test_can_allocate_counts_reclaimed_cached_hits() -> None:
    bm = BlockManager(4, 4)
    bm.free(admit(bm, range(9)))  # two cached blocks in the LRU, two free
    seq = make_seq([*range(8), 50, 51, 52, 53, 54])  # hits both cached blocks, needs 2 fresh
    assert bm.num_free_blocks == 4
    assert bm.can_allocate(seq) and bm.can_allocate(seq, reserve_tokens=3)
    assert not bm.can_allocate(seq, reserve_tokens=4)  # 3 fresh blocks: only 2 remain once hits are taken
    big = make_seq(range(100, 117))
    assert not bm.can_allocate(big)
    with pytest.raises(OutOfBlocksError):
        bm.allocate(big)
    bm.check_invariants()
    assert bm.num_free_blocks == 4 and big.block_table == []
    bm.allocate(seq)
    assert bm.num_free_blocks == 0 and bm.can_append(seq, 8) and not bm.can_append(seq, 9)


def test_append_slots_grows_the_table_for_the_tokens_a_step_computes() -> None:
    bm = BlockManager(8, 4)
    seq = admit(bm, range(5))
    for token in (5, 6, 7, 8):
        seq.append_token(token)
        assert bm.can_append(seq)
        bm.append_slots(seq)  # decode: the last sampled token
        bm.mark_computed(seq, seq.num_tokens)
    assert len(seq.block_table) == 3 and bm.num_cached_blocks == 2
    assert seq.completion_ids == [5, 6, 7, 8]
    t = seq.block_table
    assert bm.slot_mapping(seq, 2, 9) == [
        t[0] * 4 + 2,
        t[0] * 4 + 3,
        *range(t[1] * 4, t[1] * 4 + 4),
        t[2] * 4,
    ]
    with pytest.raises(AssertionError):
        bm.mark_computed(seq, seq.num_tokens + 1)


def test_a_shared_block_is_never_written() -> None:
    bm = BlockManager(8, 4)
    admit(bm, range(9))
    b = admit(bm, range(9), computed=False)
    b.num_computed_tokens = 0  # a scheduler bug: recompute from the start into the shared block
    with pytest.raises(AssertionError, match="shared block"):
        bm.append_slots(b, 4)


def test_duplicate_blocks_keep_one_cached_copy() -> None:
    bm = BlockManager(4, 4)
    a, b = admit(bm, range(5), computed=False), admit(bm, range(5), computed=False)
    prefill(bm, a)
    prefill(bm, b)  # b computed the same block: a's copy stays the cached one
    bm.check_invariants()
    assert bm.num_cached_blocks == 1
    twin = b.block_table[0]
    bm.free(a)
    admit(bm, [20], computed=False)  # takes a's free partial block
    admit(bm, [21], computed=False)  # evicts a's cached copy
    assert bm.num_cached_blocks == 0
    bm.free(b)  # b's copy has no cached twin left: it takes its place
    bm.check_invariants()
    assert bm.num_cached_blocks == 1
    assert admit(bm, range(5), computed=False).block_table[0] == twin


def test_disabled_prefix_cache_never_registers_or_hits() -> None:
    bm = BlockManager(8, 4, enable_prefix_cache=False)
    bm.free(admit(bm, range(12)))
    assert bm.num_cached_blocks == 0 and bm.num_free_blocks == 8
    assert admit(bm, range(12), computed=False).num_cached_tokens == 0


def test_preempted_sequence_recomputes_its_generated_tokens_from_the_cache() -> None:
    bm = BlockManager(8, 4)
    seq = admit(bm, range(6))
    for token in (50, 51, 52):
        seq.append_token(token)
        bm.append_slots(seq)
        bm.mark_computed(seq, seq.num_tokens)
    seq.append_token(53)  # sampled, KV not yet written
    bm.free(seq)
    seq.reset_for_recompute()
    assert seq.status is SequenceStatus.PREEMPTED and seq.num_computed_tokens == 0
    assert seq.token_ids == [*range(6), 50, 51, 52, 53] and seq.completion_ids == [50, 51, 52, 53]
    bm.allocate(seq)
    assert seq.num_computed_tokens == 8 and seq.request.cached_tokens == 0  # the first admission's count
    bm.check_invariants()


def test_request_validation_and_order() -> None:
    with pytest.raises(ValueError):
        Request("r", (), SAMPLING)
    first, second, urgent = (
        Request(n, (1,), SAMPLING, priority=p) for n, p in (("a", 0), ("b", 0), ("c", -1))
    )
    assert sorted([second, first, urgent], key=lambda r: r.sort_key) == [urgent, first, second]
    first.finish("stop")
    assert first.finished
    with pytest.raises(RuntimeError):
        first.finish("abort")
    with pytest.raises(ValueError):
        second.finish("done")  # type: ignore[arg-type]


PREFIXES = [(), (1, 2, 3, 4, 5), (1, 2, 3, 9, 9, 9, 9), (7, 7, 7, 7, 7, 7)]


class BlockManagerMachine(RuleBasedStateMachine):
    """A scheduler-shaped random walk on a small pool, with a model of the KV written to each slot."""

    def __init__(self) -> None:
        super().__init__()
        self.bm: BlockManager | None = None
        self.running: list[Sequence] = []
        self.waiting: list[Sequence] = []
        self.kv: dict[int, tuple[int, ...]] = {}  # slot -> the prefix whose last token's KV it holds

    @initialize(num_blocks=st.integers(2, 10), block_size=st.integers(1, 4), cache=st.booleans())
    def setup(self, num_blocks: int, block_size: int, cache: bool) -> None:
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_cache=cache)

    def _admit(self, seq: Sequence, reserve: int) -> bool:
        bm = self.bm
        assert bm is not None
        if not bm.can_allocate(seq, reserve):
            return False
        bm.allocate(seq)
        assert bm.can_append(seq, seq.num_tokens + reserve - seq.num_computed_tokens)
        assert seq.num_computed_tokens < seq.num_tokens
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        return True

    @rule(
        prefix=st.sampled_from(PREFIXES),
        suffix=st.lists(st.integers(0, 3), max_size=5),
        reserve=st.integers(0, 4),
    )
    def add(self, prefix: tuple[int, ...], suffix: list[int], reserve: int) -> None:
        seq = make_seq([*prefix, *suffix] or [0])
        if not self._admit(seq, reserve):
            self.waiting.append(seq)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), reserve=st.integers(0, 4))
    def admit_waiting(self, data: st.DataObject, reserve: int) -> None:
        seq = data.draw(st.sampled_from(self.waiting))
        if self._admit(seq, reserve):
            self.waiting.remove(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), chunk=st.integers(1, 6), token=st.integers(0, 3))
    def step(self, data: st.DataObject, chunk: int, token: int) -> None:
        bm, seq = self.bm, data.draw(st.sampled_from(self.running))
        assert bm is not None
        n = min(chunk, seq.num_tokens - seq.num_computed_tokens)
        if not bm.can_append(seq, n):
            return  # a scheduler would preempt someone here
        bm.append_slots(seq, n)
        start = seq.num_computed_tokens
        for position, slot in zip(
            range(start, start + n), bm.slot_mapping(seq, start, start + n), strict=True
        ):
            self.kv[slot] = tuple(seq.token_ids[: position + 1])
        bm.mark_computed(seq, start + n)
        if seq.num_computed_tokens == seq.num_tokens:
            seq.append_token(token)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), preempt=st.booleans())
    def release(self, data: st.DataObject, preempt: bool) -> None:
        assert self.bm is not None
        seq = data.draw(st.sampled_from(self.running))
        self.running.remove(seq)
        self.bm.free(seq)
        if preempt:
            seq.reset_for_recompute()
            self.waiting.append(seq)
        else:
            self.bm.free(seq)

    @invariant()
    def consistent(self) -> None:
        if self.bm is None:
            return
        self.bm.check_invariants()
        for seq in self.running:  # cache hits and block reuse never hand a sequence someone else's KV
            for position in range(seq.num_computed_tokens):
                assert self.kv[self.bm.slot(seq, position)] == tuple(seq.token_ids[: position + 1])

    def teardown(self) -> None:
        if self.bm is None:
            return
        for seq in self.running:
            self.bm.free(seq)
        self.bm.check_invariants()
        assert self.bm.num_free_blocks == self.bm.num_blocks
        assert all(block.ref_count == 0 for block in self.bm.blocks)


BlockManagerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestBlockManagerMachine = BlockManagerMachine.TestCase
