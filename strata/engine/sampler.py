"""Turning one row of logits into the next token: greedy, or temperature / top-k / top-p sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """What the caller asked for; temperature 0 means greedy (argmax)."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 keeps the whole vocabulary
    seed: int | None = None
    ignore_eos: bool = False  # keep going past end-of-turn tokens (benchmarks want fixed lengths)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens is {self.max_tokens}; it must be at least 1")
        if self.temperature < 0:
            raise ValueError(f"temperature is {self.temperature}; use 0 for greedy or a positive value")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p is {self.top_p}; it must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k is {self.top_k}; use 0 to disable it or a positive count")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    """(vocab,) float32 logits -> token id.

    Sampling draws from softmax(logits / T) restricted to the top_k largest logits and then to the
    smallest prefix of them (by descending probability) whose mass reaches top_p; the token that crosses
    top_p is kept, so the set is never empty.
    """
    if params.greedy:
        return int(torch.argmax(logits))
    scaled = logits.float() / params.temperature
    k = params.top_k if 0 < params.top_k < scaled.numel() else scaled.numel()
    top_logits, top_ids = torch.topk(scaled, k)  # sorted, descending
    probs = torch.softmax(top_logits, dim=-1)
    if params.top_p < 1.0:
        mass_before = torch.cumsum(probs, dim=-1) - probs
        probs = torch.where(mass_before < params.top_p, probs, torch.zeros_like(probs))
    choice = torch.multinomial(probs, 1, generator=generator)
    return int(top_ids[choice])
