"""KV storage handed to attention: one preallocated tensor addressed by slot numbers."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class KVCache:
    """K and V for every layer in one tensor; a token's K/V live at its slot in every layer.

    Attention never owns a growing tensor: it writes new tokens at the slots it is given and reads the
    context back by slot. A contiguous sequence uses slots 0..n-1; the paged engine maps positions to
    slots through block tables (slot = block * block_size + offset) and hands over the same tensors.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        # (num_layers, 2, num_slots, num_kv_heads, head_dim)
        shape = (num_layers, 2, num_slots, num_kv_heads, head_dim)
        self.kv = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.kv[layer, 0, slots] = k.to(self.kv.dtype)
        self.kv[layer, 1, slots] = v.to(self.kv.dtype)

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv[layer, 0, slots], self.kv[layer, 1, slots]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V, each (num_slots, num_kv_heads, head_dim), as the kernels read them."""
        return self.kv[layer, 0], self.kv[layer, 1]


def slot_of(block_table: list[int], block_size: int, position: int) -> int:
    """KV slot of `position` in a sequence with this block table."""
    return block_table[position // block_size] * block_size + position % block_size


def slots_of(block_table: list[int], block_size: int, start: int, end: int) -> torch.Tensor:
    """(end - start,) KV slots of positions start..end-1 of a sequence with this block table."""
    positions = torch.arange(start, end)
    blocks = torch.tensor(block_table, dtype=torch.long)[positions // block_size]
    return blocks * block_size + positions % block_size


@dataclass(frozen=True)
class PagedDecode:
    """A decode step (one new token per sequence) as the paged attention kernel reads it.

    Position j of sequence b is at slot block_tables[b, j // block_size] * block_size + j %
    block_size. `num_splits` is fixed by the host (a captured CUDA graph keeps it), so choosing it
    never reads the device.
    """

    block_tables: torch.Tensor  # (batch, max_blocks) int32
    context_lens: torch.Tensor  # (batch,) int32, counting the new token
    block_size: int
    max_context_len: int  # an upper bound of context_lens, known on the host
    num_splits: int | None = None  # None: paged_decode_attention's choice for max_context_len
    block_t: int = 0  # positions a loop step; 0: the launch that STRATA_ATTN_BLOCK_T gives
    num_stages: int = 0  # the split kernel's pipelining depth; 0: STRATA_ATTN_STAGES's
    max_splits: int = 0  # the most splits a sequence when num_splits is None; 0: STRATA_MAX_SPLITS's


@dataclass(frozen=True)
class PagedPrefill:
    """A step of any query lengths (prefill chunks, mixed with decodes) as the paged prefill kernel
    reads it: sequence b's new tokens are rows query_start[b]:query_start[b + 1] of the step and the
    last of its context_lens[b] positions."""

    block_tables: torch.Tensor  # (batch, max_blocks) int32
    context_lens: torch.Tensor  # (batch,) int32, counting the new tokens
    query_start: torch.Tensor  # (batch + 1,) int32
    block_size: int
    max_query_len: int  # known on the host: sizes the launch grid


@dataclass
class AttentionMetadata:
    """Where one forward step's tokens sit: built once per step, shared by every layer.

    The step's tokens are the concatenation of each sequence's new tokens (`query_lens`); sequence i
    attends over `context_slots[i]`, the slots of its whole context (cached, earlier and new tokens)
    in position order, so its key at index j is at position j.
    """

    positions: torch.Tensor  # (num_tokens,) position of each new token
    slot_mapping: torch.Tensor  # (num_tokens,) slot each new token's K/V is written to
    query_lens: tuple[int, ...]  # new tokens per sequence, in batch order
    context_slots: tuple[torch.Tensor, ...]  # per sequence: (context_len,) slots in position order
    paged: PagedDecode | None = None  # set for decode steps on the kernel path (then context_slots is empty)
    paged_prefill: PagedPrefill | None = None  # set for other steps when the prefill kernel is on
    _masks: dict[tuple[int, int | None], torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def contiguous(cls, start: int, num_tokens: int, device: torch.device | str = "cpu") -> AttentionMetadata:
        """Tokens start..start+num_tokens-1 of one sequence stored at slots equal to their positions."""
        positions = torch.arange(start, start + num_tokens, device=device)
        return cls(positions, positions, (num_tokens,), (torch.arange(start + num_tokens, device=device),))

    def query_slices(self) -> list[slice]:
        bounds, start = [], 0
        for n in self.query_lens:
            bounds.append(slice(start, start + n))
            start += n
        return bounds

    def mask(self, seq: int, rows: slice, window: int | None) -> torch.Tensor:
        """(query_len, context_len) bool for sequence `seq`: causal, within `window` when it is set."""
        key = (seq, window)
        if key not in self._masks:
            key_pos = torch.arange(self.context_slots[seq].numel(), device=self.positions.device)
            delta = self.positions[rows, None] - key_pos[None, :]
            allowed = delta >= 0
            if window is not None:
                allowed &= delta < window
            self._masks[key] = allowed
        return self._masks[key]
