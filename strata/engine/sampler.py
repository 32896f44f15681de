"""Turning a batch of logits into next tokens, each row with its own `SamplingParams`.

Per row, in this order (each step is a small pure function below; none modifies its input):
  1. logit_bias            l[t] += bias[t]
  2. repetition_penalty    over prompt + generated tokens (HF / llama.cpp)
  3. frequency / presence  over generated tokens only (OpenAI)
  -> logprobs are read here: log_softmax of these logits, before temperature and filtering
  4. greedy rows: argmax; sampled rows: temperature, top-k, top-p, min-p (HF's order), one draw.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch

GREEDY_BELOW = 1e-5  # temperatures under this are greedy (as vLLM): 1/T would blow up the logits
MAX_TOP_LOGPROBS = 20  # OpenAI's limit


class FrozenBias(Mapping[int, float]):
    """An immutable, hashable token id -> bias mapping, so `SamplingParams` stays frozen and hashable."""

    def __init__(self, items: Mapping[int, float] | None = None) -> None:
        self._d = dict(sorted((int(k), float(v)) for k, v in (items or {}).items()))

    def __getitem__(self, key: int) -> float:
        return self._d[key]

    def __iter__(self) -> Iterator[int]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        return hash(tuple(self._d.items()))

    def __repr__(self) -> str:
        return f"FrozenBias({self._d!r})"


@dataclass(frozen=True)
class SamplingParams:
    """What one request asked for; temperature 0 means greedy (argmax). Invalid values raise ValueError."""

    max_tokens: int | None = 128  # None: as many as fit in the context (see `max_new_tokens`)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 keeps the whole vocabulary
    min_p: float = 0.0  # keep tokens with p >= min_p * p_max; 0 disables
    presence_penalty: float = 0.0  # OpenAI: l -= presence * [count > 0], over generated tokens
    frequency_penalty: float = 0.0  # OpenAI: l -= frequency * count, over generated tokens
    repetition_penalty: float = 1.0  # HF: l / r if l > 0 else l * r, over prompt + generated; 1 disables
    logit_bias: Mapping[int, float] = field(default_factory=FrozenBias)  # token id -> added to its logit
    logprobs: bool = False  # report the chosen token's log-probability
    top_logprobs: int = 0  # and this many most likely alternatives (needs logprobs)
    stop: tuple[str, ...] = ()  # stop strings (see strata.engine.stop)
    stop_token_ids: tuple[int, ...] = ()  # tokens that end the sequence (even with ignore_eos)
    seed: int | None = None
    ignore_eos: bool = False  # keep going past end-of-turn tokens (benchmarks want fixed lengths)

    def __post_init__(self) -> None:
        # Normalize containers so equal requests compare and hash equal (lists, dicts are accepted).
        object.__setattr__(self, "logit_bias", FrozenBias(self.logit_bias))
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        for problem in self._problems():
            raise ValueError(problem)

    def _problems(self) -> Iterator[str]:
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            yield f"seed {self.seed} is outside the 64-bit range [-2**63, 2**64); pick a smaller seed"
        if self.max_tokens is not None and self.max_tokens < 1:
            yield f"max_tokens is {self.max_tokens}; it must be at least 1 (or None to fill the context)"
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            yield f"temperature is {self.temperature}; use 0 for greedy or a positive value"
        if not 0.0 < self.top_p <= 1.0:
            yield f"top_p is {self.top_p}; it must be in (0, 1], and 1 disables it"
        if self.top_k < 0:
            yield f"top_k is {self.top_k}; use 0 to disable it or a positive count"
        if not 0.0 <= self.min_p <= 1.0:
            yield f"min_p is {self.min_p}; it must be in [0, 1], and 0 disables it"
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                yield f"{name} is {value}; it must be in [-2, 2], and 0 disables it"
        if not (math.isfinite(self.repetition_penalty) and 0.01 <= self.repetition_penalty <= 100):
            # Beyond this range the scaled logits overflow to inf and sampling has nothing to pick.
            yield (
                f"repetition_penalty is {self.repetition_penalty}; it must be in [0.01, 100] (1 disables it)"
            )
        for token, bias in self.logit_bias.items():
            if token < 0 or math.isnan(bias) or bias == math.inf:
                yield f"logit_bias {{{token}: {bias}}}: ids must be >= 0, biases finite or -inf (to ban)"
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            yield f"top_logprobs is {self.top_logprobs}; it must be in [0, {MAX_TOP_LOGPROBS}]"
        if self.top_logprobs and not self.logprobs:
            yield f"top_logprobs is {self.top_logprobs} but logprobs is off; set logprobs=True too"
        if any(not isinstance(s, str) or not s for s in self.stop):
            yield f"stop is {self.stop!r}; every stop string must be a non-empty str"
        if any(t < 0 for t in self.stop_token_ids):
            yield f"stop_token_ids is {self.stop_token_ids!r}; token ids must be >= 0"

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def plain_argmax(self) -> bool:
        """Greedy with nothing that reads the host per token: no logit bias, penalties or logprobs (the
        token is the argmax of the raw logits, so the GPU can pick it and feed it to the next step)."""
        neutral = self.presence_penalty == 0 and self.frequency_penalty == 0 and self.repetition_penalty == 1
        return self.greedy and neutral and not self.logit_bias and not self.logprobs


def max_new_tokens(params: SamplingParams, prompt_len: int, context_len: int) -> int:
    """How many tokens a request may generate: `max_tokens`, or all the room left when it is None."""
    room = context_len - prompt_len
    if room < 1:
        raise ValueError(
            f"prompt is {prompt_len:,} tokens, which leaves no room to generate in the model's context "
            f"of {context_len:,}; shorten the prompt to at most {context_len - 1:,} tokens"
        )
    if params.max_tokens is None:
        return room
    if params.max_tokens > room:
        raise ValueError(
            f"prompt is {prompt_len:,} tokens and max_tokens is {params.max_tokens:,}; together they exceed "
            f"the model's context of {context_len:,}; shorten the prompt or lower max_tokens to at most "
            f"{room:,} (or leave it unset to fill the context)"
        )
    return params.max_tokens


@dataclass(frozen=True)
class SampleOutput:
    """One step's result for a batch; `logprobs` / `top_logprobs` are None for rows that did not ask."""

    token_ids: list[int]
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]


def apply_logit_bias(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """(B, V) logits with each row's `logit_bias` added: l[b, t] += bias_b[t] (-inf bans t)."""
    rows = [b for b, p in enumerate(params) for _ in p.logit_bias]
    if not rows:
        return logits
    cols = [t for p in params for t in p.logit_bias]
    if max(cols) >= logits.shape[-1]:
        raise ValueError(f"logit_bias names token {max(cols)}, but the vocabulary has {logits.shape[-1]:,}")
    bias = torch.tensor([v for p in params for v in p.logit_bias.values()], device=logits.device)
    out = logits.clone()
    out[rows, cols] += bias  # (row, token) pairs are unique, so no accumulate is needed
    return out


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    histories: Sequence[Sequence[int]],
    num_prompt_tokens: Sequence[int],
) -> torch.Tensor:
    """(B, V) logits with repetition, frequency and presence penalties applied, row by row.

    histories[b] is row b's prompt followed by its generated tokens; the first num_prompt_tokens[b]
    are the prompt. For every token t seen in the history, with r = repetition_penalty:
        l[t] = l[t] / r if l[t] > 0 else l[t] * r          (always less likely for r > 1)
    then, with c[t] = how often t was generated (the prompt does not count):
        l[t] -= frequency_penalty * c[t] + presence_penalty * (c[t] > 0)
    """
    rep: list[tuple[int, int, float]] = []  # (row, token, r)
    pen: list[tuple[int, int, float]] = []  # (row, token, amount to subtract)
    for b, (p, history, n_prompt) in enumerate(zip(params, histories, num_prompt_tokens, strict=True)):
        if p.repetition_penalty != 1.0:
            rep += [(b, t, p.repetition_penalty) for t in set(history)]
        if p.frequency_penalty or p.presence_penalty:
            counts = Counter(history[n_prompt:]).items()
            pen += [(b, t, p.frequency_penalty * c + p.presence_penalty) for t, c in counts]
    if not rep and not pen:
        return logits
    if any(not 0 <= t < logits.shape[-1] for _, t, _ in rep + pen):
        raise ValueError(f"a history holds a token id outside the vocabulary of {logits.shape[-1]:,}")
    out = logits.clone()
    if rep:
        rows, ids, r = (list(column) for column in zip(*rep, strict=True))
        x, rt = out[rows, ids], torch.tensor(r, device=out.device)
        out[rows, ids] = torch.where(x > 0, x / rt, x * rt)
    if pen:  # (row, token) pairs are unique per Counter, so plain indexing is exact
        rows, ids, delta = (list(column) for column in zip(*pen, strict=True))
        out[rows, ids] -= torch.tensor(delta, device=out.device)
    return out


def filter_probs(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, V) logits -> (probs, ids), each (n, C): candidates by descending probability, renormalized.

    p = softmax(l / T) over the top_k largest logits (all when top_k is 0); then top-p keeps the
    smallest prefix whose mass reaches top_p (the token crossing it stays, so the set is never empty),
    then min-p drops tokens with p < min_p * p_max. Dropped candidates get probability 0; every kept
    set is a prefix of the sorted order, which the draw relies on.
    """
    scaled = logits / temperature
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        top, ids = torch.topk(scaled, top_k, dim=-1)  # sorted, descending
    else:
        top, ids = torch.sort(scaled, dim=-1, descending=True)
    probs = torch.softmax(top, dim=-1)
    if top_p < 1.0:
        mass_before = torch.cumsum(probs, dim=-1) - probs
        probs = probs.masked_fill(mass_before >= top_p, 0.0)
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs[:, :1], 0.0)  # probs[:, 0] is p_max
    return probs / probs.sum(dim=-1, keepdim=True), ids


def _draw(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """One index per row of (n, C) descending probs, by inverse CDF: first i with cdf[i] > u * cdf[-1].

    u ~ U[0, 1) comes from the row's own generator (on the CPU, so a seed means the same thing on every
    device), so a row's draw depends only on its probabilities and its generator, never on the batch.
    """
    u = torch.stack([torch.rand((), generator=g) for g in generators]).to(probs.device)
    cdf = torch.cumsum(probs, dim=-1)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    # u * total can round up to total; the last kept candidate is the furthest a draw may go.
    return torch.minimum(pick, (probs > 0).sum(dim=-1) - 1)


def sample_batch(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    histories: Sequence[Sequence[int]],
    num_prompt_tokens: Sequence[int],
) -> SampleOutput:
    """(B, V) logits -> one next token per row, each under its own params and generator.

    histories / num_prompt_tokens feed the penalties (see `apply_penalties`). A row's token depends
    only on its logits, params, history and generator: a seeded request samples the same tokens
    alone or in any batch. Logprobs are those of the model's distribution after logit_bias and
    penalties, at temperature 1 and unfiltered (vLLM's default), so they do not move with sampling knobs.
    """
    batch = logits.shape[0]
    if not len(params) == len(generators) == len(histories) == len(num_prompt_tokens) == batch:
        raise ValueError(f"{batch} rows of logits need as many params, generators, histories, prompt lengths")
    biased = apply_logit_bias(logits.float(), params)
    processed = apply_penalties(biased, params, histories, num_prompt_tokens)
    tokens = [0] * batch
    greedy = [b for b, p in enumerate(params) if p.greedy]
    if greedy:
        # All-greedy batches (the common case) take the argmax in place: indexing would copy (B, V).
        picked = processed if len(greedy) == batch else processed[greedy]
        for b, t in zip(greedy, picked.argmax(dim=-1).tolist(), strict=True):
            tokens[b] = t
    groups: dict[tuple[float, int, float, float], list[int]] = {}
    for b, p in enumerate(params):
        if not p.greedy:  # rows that share the filter settings are filtered in one batched call
            groups.setdefault((p.temperature, p.top_k, p.top_p, p.min_p), []).append(b)
    for (temperature, top_k, top_p, min_p), rows in groups.items():
        probs, ids = filter_probs(processed[rows], temperature, top_k, top_p, min_p)
        picks = _draw(probs, [generators[b] for b in rows])
        for b, t in zip(rows, ids.gather(-1, picks.unsqueeze(-1)).squeeze(-1).tolist(), strict=True):
            tokens[b] = t
    return SampleOutput(tokens, *_logprobs(processed, params, tokens))


def _logprobs(
    processed: torch.Tensor, params: Sequence[SamplingParams], tokens: list[int]
) -> tuple[list[float | None], list[list[tuple[int, float]] | None]]:
    """The chosen tokens' log-probabilities and each row's top alternatives (banned, -inf ones left out)."""
    chosen: list[float | None] = [None] * len(params)
    tops: list[list[tuple[int, float]] | None] = [None] * len(params)
    rows = [b for b, p in enumerate(params) if p.logprobs]
    if not rows:
        return chosen, tops
    logp = torch.log_softmax(processed[rows], dim=-1)
    picked = logp.gather(-1, torch.tensor([[tokens[b]] for b in rows], device=logp.device)).squeeze(-1)
    n = max(params[b].top_logprobs for b in rows)
    top_vals, top_ids = torch.topk(logp, min(n, logp.shape[-1]), dim=-1)
    for i, b in enumerate(rows):
        chosen[b] = float(picked[i])
        k = params[b].top_logprobs
        pairs = zip(top_ids[i, :k].tolist(), top_vals[i, :k].tolist(), strict=True)
        tops[b] = [(t, v) for t, v in pairs if v > -math.inf] if k else None
    return chosen, tops


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    history: Sequence[int] = (),
    num_prompt_tokens: int = 0,
) -> int:
    """(vocab,) float32 logits -> token id: `sample_batch` for one row."""
    out = sample_batch(logits.unsqueeze(0), [params], [generator], [history], [num_prompt_tokens])
    return out.token_ids[0]
