"""KV block bookkeeping: reference counts, free lists and a hash-chained prefix cache over full blocks.

Pure Python over block ids; the KV tensor lives elsewhere and is addressed by slot =
block_id * block_size + offset. Every block is in exactly one state:

- referenced: ref_count > 0, in the block table of that many live sequences;
- free-cached: ref_count 0, keeps its KV and hash, in the LRU; a later prompt may hit it;
- free: ref_count 0, no hash, in the free list.

A full block's hash is hash((parent_hash, block_tokens)), parent_hash being the previous block's (None
for the first), so a hit means the whole prefix matches, not just the block. Python's hash of ints and
tuples is stable within a process (hash(None) is not across processes before 3.12), which is all a
cache living in one process needs; matched blocks' tokens are compared too, against collisions.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass

from strata.engine.sequence import Sequence


class OutOfBlocksError(RuntimeError):
    """allocate/append_slots found too few blocks: the caller skipped can_allocate/can_append."""


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set once the block is full and its KV computed
    parent_hash: int | None = None
    token_ids: tuple[int, ...] = ()


class BlockManager:
    """Hands out KV blocks to sequences and shares computed full blocks between equal prefixes."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks}x{block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_cache = enable_prefix_cache
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))
        self._lru: OrderedDict[int, None] = OrderedDict()  # free-cached blocks, least recently used first
        self._hash_to_block: dict[int, int] = {}
        self._children: dict[int | None, set[int]] = {}  # parent hash -> cached blocks that follow it
        self._seqs: dict[int, Sequence] = {}  # live sequences (allocated, not yet freed)
        self._num_hashed: dict[int, int] = {}  # seq_id -> leading blocks of its table that have a hash

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: truly free plus evictable cached ones."""
        return len(self._free) + len(self._lru)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, referenced or not."""
        return len(self._hash_to_block)

    def _match(self, token_ids: list[int]) -> tuple[list[int], int | None]:
        """Longest chain of cached full blocks matching token_ids, and where the best match diverged."""
        if not self.enable_prefix_cache or not self._hash_to_block:
            return [], None
        bs, hits, parent = self.block_size, [], None
        for start in range(0, len(token_ids) - bs + 1, bs):
            tokens = tuple(token_ids[start : start + bs])
            block_id = self._hash_to_block.get(hash((parent, tokens)))
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
            parent = self.blocks[block_id].hash
        start = len(hits) * bs
        rest = token_ids[start : start + bs]  # the first block not hit; may be partial or empty
        if not rest:
            return hits, None
        best = 0
        for child in self._children.get(parent, ()):
            cached = self.blocks[child].token_ids
            n = 0
            while n < len(rest) and rest[n] == cached[n]:
                n += 1
            best = max(best, n)
        # A partial last block that agrees with a cached one has no divergence; it just can't be hit.
        return hits, (start + best if best < len(rest) else None)

    def _usable_hits(self, seq: Sequence) -> tuple[list[int], int | None]:
        hits, miss = self._match(seq.token_ids)
        if len(hits) * self.block_size == seq.num_tokens:
            # The last token must be computed to get logits. Recomputing it inside the hit block would
            # write into a shared block, which is never allowed, so the whole last block is recomputed.
            hits.pop()
        return hits, miss

    def can_allocate(self, seq: Sequence, reserve_tokens: int = 0) -> bool:
        """Whether `allocate(seq)` and then `reserve_tokens` more tokens fit in free + evictable blocks."""
        hits, _ = self._usable_hits(seq)
        needed = self._blocks_for(seq.num_tokens + reserve_tokens) - len(hits)
        # A hit on a free-cached block takes it out of the evictable pool without needing a new block.
        reclaimed = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return needed <= self.num_free_blocks - reclaimed

    def allocate(self, seq: Sequence) -> None:
        """Give a waiting sequence blocks for all its tokens, reusing the longest cached prefix.

        Sets seq.num_cached_tokens = seq.num_computed_tokens = hit length (whole blocks, at most
        num_tokens - 1). On the sequence's first allocation it also records `cached_tokens` and
        `cache_miss_position` on the request (a recompute after preemption does not overwrite them).
        """
        assert seq.seq_id not in self._seqs and not seq.block_table, f"{seq} is already allocated"
        if not self.can_allocate(seq):
            raise OutOfBlocksError(f"not enough free KV blocks for {seq}")
        hits, miss = self._usable_hits(seq)
        for block_id in hits:  # take references first, so the fresh blocks below can't evict a hit
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._lru[block_id]
            block.ref_count += 1
        fresh = seq.num_blocks(self.block_size) - len(hits)
        seq.block_table = hits + [self._take_block() for _ in range(fresh)]
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        self._seqs[seq.seq_id] = seq
        self._num_hashed[seq.seq_id] = len(hits)
        if seq.num_preemptions == 0:
            seq.request.cached_tokens = seq.num_cached_tokens
            seq.request.cache_miss_position = miss

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """Whether `append_slots(seq, num_new_tokens)` fits."""
        return self._missing_blocks(seq, num_new_tokens) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        """Grow the block table so that tokens up to seq.num_computed_tokens + num_new_tokens have slots.

        `num_new_tokens` is what the coming step computes for this sequence: 1 for a decode (the last
        sampled token), the chunk length for a prefill chunk. The written blocks are always private.
        """
        missing = self._missing_blocks(seq, num_new_tokens)
        if missing > self.num_free_blocks:
            raise OutOfBlocksError(f"not enough free KV blocks to grow {seq} by {num_new_tokens} tokens")
        seq.block_table.extend(self._take_block() for _ in range(missing))
        self._assert_writable(seq, seq.num_computed_tokens, seq.num_computed_tokens + num_new_tokens)

    def mark_computed(self, seq: Sequence, num_computed_tokens: int) -> None:
        """KV of seq.token_ids[:num_computed_tokens] is now written: register the newly full blocks.

        Sets seq.num_computed_tokens. Idempotent; also registers correctly when the caller has already
        advanced seq.num_computed_tokens itself.
        """
        assert seq.seq_id in self._seqs, f"{seq} was not allocated here"
        old = seq.num_computed_tokens
        assert old <= num_computed_tokens <= seq.num_tokens, f"{seq}: cannot mark {num_computed_tokens}"
        assert num_computed_tokens <= len(seq.block_table) * self.block_size, f"{seq}: wrote past its blocks"
        self._assert_writable(seq, old, num_computed_tokens)
        seq.num_computed_tokens = num_computed_tokens
        if not self.enable_prefix_cache:
            return
        bs, hashed = self.block_size, self._num_hashed[seq.seq_id]
        self._num_hashed[seq.seq_id] = max(hashed, num_computed_tokens // bs)
        for i in range(hashed, num_computed_tokens // bs):
            block = self.blocks[seq.block_table[i]]
            block.parent_hash = self.blocks[seq.block_table[i - 1]].hash if i > 0 else None
            block.token_ids = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            block.hash = hash((block.parent_hash, block.token_ids))
            # If another sequence computed the same block first, that copy stays the cached one.
            if block.hash not in self._hash_to_block:
                self._register(block)

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references and clear its block table; safe to call twice."""
        assert not seq.block_table or seq.seq_id in self._seqs, f"{seq} was not allocated here"
        # Release the tail first: the LRU then evicts a prefix's last blocks before its shared start.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count > 0:
                continue
            if block.hash is not None and self._hash_to_block.get(block.hash, block_id) == block_id:
                if block.hash not in self._hash_to_block:
                    self._register(block)  # a duplicate whose cached twin was evicted takes its place
                self._lru[block_id] = None
            else:
                self._clear(block)
                self._free.append(block_id)
        seq.block_table = []
        self._seqs.pop(seq.seq_id, None)
        self._num_hashed.pop(seq.seq_id, None)

    def slot(self, seq: Sequence, position: int) -> int:
        """KV slot of the token at `position`."""
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        """KV slots of positions start..end-1 (to write new tokens or read a context back)."""
        return [self.slot(seq, p) for p in range(start, end)]

    def _blocks_for(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def _missing_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(0, self._blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table))

    def _assert_writable(self, seq: Sequence, start: int, end: int) -> None:
        for i in range(start // self.block_size, self._blocks_for(end)):
            block = self.blocks[seq.block_table[i]]
            assert block.ref_count == 1 and block.hash is None, f"{seq} would write shared block {block}"

    def _take_block(self) -> int:
        if self._free:
            block_id = self._free.popleft()
        elif self._lru:
            block_id, _ = self._lru.popitem(last=False)
            self._unregister(self.blocks[block_id])
        else:
            raise OutOfBlocksError("no free KV block")
        self.blocks[block_id].ref_count = 1
        return block_id

    def _register(self, block: Block) -> None:
        assert block.hash is not None
        self._hash_to_block[block.hash] = block.block_id
        self._children.setdefault(block.parent_hash, set()).add(block.block_id)

    def _unregister(self, block: Block) -> None:
        assert block.hash is not None and self._hash_to_block[block.hash] == block.block_id
        del self._hash_to_block[block.hash]
        siblings = self._children[block.parent_hash]
        siblings.discard(block.block_id)
        if not siblings:
            del self._children[block.parent_hash]
        self._clear(block)

    def _clear(self, block: Block) -> None:
        block.hash, block.parent_hash, block.token_ids = None, None, ()

    def check_invariants(self) -> None:
        """Assert the bookkeeping is consistent (for tests: O(blocks + tokens))."""
        held = Counter(b for seq in self._seqs.values() for b in seq.block_table)
        free, lru = set(self._free), set(self._lru)
        assert len(free) == len(self._free) and not free & lru, "free list and LRU overlap or repeat"
        for block in self.blocks:
            b = block.block_id
            assert block.ref_count == held[b], f"{block}: held by {held[b]} live sequences"
            cached = block.hash is not None and self._hash_to_block.get(block.hash) == b
            if block.ref_count > 0:
                assert b not in free and b not in lru, f"referenced {block} is on a free list"
                assert block.ref_count == 1 or cached, f"{block} is shared but not a cached block"
            elif b in lru:
                assert cached, f"{block} is in the LRU without being cached"
            else:
                assert b in free and block.hash is None, f"{block} is lost or free with a hash"
        for h, b in self._hash_to_block.items():
            assert self.blocks[b].hash == h, f"hash map disagrees with {self.blocks[b]}"
        children = {(self.blocks[b].parent_hash, b) for b in self._hash_to_block.values()}
        assert children == {(p, b) for p, bs in self._children.items() for b in bs}, "children index stale"
        assert self.enable_prefix_cache or not self._hash_to_block, "prefix cache disabled but populated"
        bs = self.block_size
        assert self._num_hashed.keys() == self._seqs.keys(), "per-sequence hash counts are stale"
        for seq in self._seqs.values():
            assert seq.num_computed_tokens <= len(seq.block_table) * bs, f"{seq}: computed past its blocks"
            hashed = self._num_hashed[seq.seq_id]
            assert hashed <= seq.num_computed_tokens // bs, f"{seq}: uncomputed blocks have hashes"
            for i, b in enumerate(seq.block_table):
                block, parent = self.blocks[b], self.blocks[seq.block_table[i - 1]].hash if i else None
                if i < hashed:
                    tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
                    assert block.hash == hash((parent, tokens)), f"{seq}: block {i} hash is not chained"
                else:
                    assert block.hash is None, f"{seq}: uncomputed block {i} has a hash"
