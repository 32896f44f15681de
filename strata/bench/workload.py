"""The work every arm does: the shape of one measurement and its deterministic prompt token ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

MODES = ("decode", "prefill")


@dataclass(frozen=True)
class Workload:
    """One measurement: `batch` sequences, each `depth` tokens already in the KV cache (untimed), then
    `prompt_len` prompt tokens prefilled (timed: prefill) and, in decode mode, `new_tokens` more
    generated greedily after the first (timed: decode). End-of-turn tokens are ignored."""

    mode: str = "decode"
    prompt_len: int = 128
    new_tokens: int = 32
    depth: int = 0
    batch: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.prompt_len < 1 or self.batch < 1:
            raise ValueError(f"prompt tokens ({self.prompt_len}) and batch ({self.batch}) must be at least 1")
        if self.depth < 0:
            raise ValueError(f"depth is {self.depth}; it must be 0 or more")
        if self.mode == "decode" and self.new_tokens < 1:
            raise ValueError(f"new tokens is {self.new_tokens}; decode needs at least 1")

    @property
    def num_generated(self) -> int:
        """Tokens each sequence emits: the one the prefill samples, plus the decoded ones."""
        return 1 + self.new_tokens if self.mode == "decode" else 1

    @property
    def max_context(self) -> int:
        return self.depth + self.prompt_len + self.num_generated

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Workload:
        return cls(**data)


def make_prompts(workload: Workload, vocab: Sequence[int]) -> list[list[int]]:
    """`batch` lists of depth + prompt_len ids drawn (seeded) from `vocab`: the same for every arm."""
    if not vocab:
        raise ValueError("the model has no plain tokens to build a prompt from")
    rng = np.random.default_rng(workload.seed)
    pool = np.asarray(vocab, dtype=np.int64)
    length = workload.depth + workload.prompt_len
    return [pool[rng.integers(0, len(pool), length)].tolist() for _ in range(workload.batch)]


def plain_token_ids(token_types: Sequence[int]) -> list[int]:
    """Ids of normal tokens (GGUF token type 1): random prompts never contain control tokens."""
    return [i for i, kind in enumerate(token_types) if kind == 1]
