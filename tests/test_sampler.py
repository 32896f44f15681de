"""The sampler: filters and penalties match plain references; bias, logprobs, seeds and batching behave."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch

from strata.engine.sampler import (
    SamplingParams,
    apply_logit_bias,
    apply_penalties,
    filter_probs,
    max_new_tokens,
    sample,
    sample_batch,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_greedy_is_argmax() -> None:
    logits = torch.randn(1000)
    assert sample(logits, SamplingParams()) == int(logits.argmax())
    assert SamplingParams(temperature=1e-7).greedy and not SamplingParams(temperature=0.1).greedy


def test_top_k_stays_in_the_top_k() -> None:
    logits = torch.randn(500)
    allowed = set(torch.topk(logits, 5).indices.tolist())
    params = SamplingParams(temperature=2.0, top_k=5)
    gen = _gen(0)
    picks = {sample(logits, params, gen) for _ in range(300)}
    assert picks <= allowed and len(picks) > 1


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    params = SamplingParams(temperature=1.0, top_p=0.7)  # 0.5 alone < 0.7, so {0, 1}
    gen = _gen(0)
    picks = {sample(probs.log(), params, gen) for _ in range(300)}
    assert picks == {0, 1}


def test_tiny_top_p_is_greedy() -> None:
    logits = torch.randn(100)
    assert sample(logits, SamplingParams(temperature=1.0, top_p=1e-6), _gen(3)) == int(logits.argmax())


def test_seed_repeats() -> None:
    logits = torch.randn(2000)
    params = SamplingParams(temperature=1.0)
    a = [sample(logits, params, _gen(7)) for _ in range(5)]
    b = [sample(logits, params, _gen(7)) for _ in range(5)]
    assert a == b


def _reference_probs(logits: np.ndarray, t: float, k: int, p: float, min_p: float) -> np.ndarray:
    """Sort-based float64 reference: temperature, top-k, top-p (crossing token kept), min-p."""
    x = logits.astype(np.float64) / t
    order = np.argsort(-x, kind="stable")
    if 0 < k < len(x):
        order = order[:k]
    probs = np.exp(x[order] - x[order].max())
    probs /= probs.sum()
    if p < 1:
        probs[np.cumsum(probs) - probs >= p] = 0
    if min_p > 0:
        probs[probs < min_p * probs.max()] = 0
    dense = np.zeros_like(x)
    dense[order] = probs / probs.sum()
    return dense


@pytest.mark.parametrize(
    "t, k, p, min_p",
    [(1.0, 0, 1.0, 0.0), (0.7, 50, 1.0, 0.0), (1.3, 0, 0.9, 0.0), (1.0, 0, 1.0, 0.05), (0.8, 40, 0.95, 0.02)]
    + [(2.0, 10, 0.5, 0.1), (0.5, 0, 0.8, 0.3), (1.0, 1, 1.0, 0.0)],
)
def test_filters_match_a_sort_based_reference(t: float, k: int, p: float, min_p: float) -> None:
    logits = torch.randn(6, 1000, generator=_gen(int(t * 100) + k)) * 3
    probs, ids = filter_probs(logits, t, k, p, min_p)
    dense = torch.zeros_like(logits).scatter(1, ids, probs).double().numpy()
    for row, got in zip(logits.numpy(), dense, strict=True):
        want = _reference_probs(row, t, k, p, min_p)
        assert set(np.flatnonzero(got)) == set(np.flatnonzero(want))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


def test_draws_follow_the_filtered_distribution() -> None:
    logits = torch.tensor([2.0, 1.5, 1.0, 0.2, -1.0, -3.0])
    params = SamplingParams(temperature=0.9, top_p=0.9)
    n = 20_000
    out = sample_batch(logits.expand(n, -1), [params] * n, [None] * n, [[]] * n, [0] * n)
    freq = np.bincount(out.token_ids, minlength=6) / n
    probs, ids = filter_probs(logits[None], 0.9, 0, 0.9, 0.0)
    want = torch.zeros(6).scatter(0, ids[0], probs[0]).numpy()
    assert np.abs(freq - want).max() < 0.015 and (freq[want == 0] == 0).all()


def _reference_penalties(
    x: np.ndarray, params: list[SamplingParams], hist: list[list[int]], n: list[int]
) -> Any:
    out = x.astype(np.float64)
    for row, p, h, n_prompt in zip(out, params, hist, n, strict=True):
        for t in set(h):
            r = p.repetition_penalty
            row[t] = row[t] / r if row[t] > 0 else row[t] * r
        for t, c in Counter(h[n_prompt:]).items():
            row[t] -= p.frequency_penalty * c + p.presence_penalty
    return out


def test_penalties_match_a_reference() -> None:
    rng = np.random.default_rng(0)
    params = [
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.7),
        SamplingParams(repetition_penalty=0.8, frequency_penalty=-0.4, presence_penalty=1.5),
        SamplingParams(),
    ]
    hist = [rng.integers(0, 60, size=40).tolist() for _ in params]
    n = [10, 25, 0, 5]
    logits = torch.randn(4, 60, generator=_gen(1))
    before = logits.clone()
    got = apply_penalties(logits, params, hist, n)
    np.testing.assert_allclose(got.numpy(), _reference_penalties(logits.numpy(), params, hist, n), atol=1e-6)
    assert torch.equal(logits, before)  # pure: the input is untouched


def test_frequency_and_presence_ignore_the_prompt() -> None:
    logits = torch.zeros(1, 10)
    params = [SamplingParams(frequency_penalty=1.0, presence_penalty=0.5)]
    got = apply_penalties(logits, params, [[3, 3, 4, 4, 4]], [2])  # generated: 4, 4, 4
    assert got[0, 3] == 0 and got[0, 4] == pytest.approx(-3.5)


def test_logit_bias_forces_and_bans() -> None:
    logits = torch.randn(1, 300, generator=_gen(2))
    assert sample(logits[0], SamplingParams(logit_bias={7: 100.0})) == 7
    top = torch.topk(logits[0], 5).indices.tolist()
    bans = dict.fromkeys(top[:4], float("-inf"))
    gen = _gen(5)
    only = SamplingParams(temperature=1.0, top_k=1, logit_bias=bans)
    assert {sample(logits[0], only, gen) for _ in range(20)} == {top[4]}  # the best one not banned
    banned = SamplingParams(temperature=5.0, logit_bias=bans)
    assert not {sample(logits[0], banned, gen) for _ in range(300)} & set(top[:4])
    assert torch.isinf(apply_logit_bias(logits, [banned])[0, top[:4]]).all()
    with pytest.raises(ValueError, match="logit_bias names token 300, but the vocabulary has 300"):
        sample(logits[0], SamplingParams(logit_bias={300: 1.0}))


def test_logprobs_are_the_biased_unfiltered_distribution() -> None:
    logits = torch.randn(3, 200, generator=_gen(4))
    params = [
        SamplingParams(logprobs=True, top_logprobs=5, logit_bias={9: 3.0}),
        SamplingParams(temperature=0.5, top_k=3, logprobs=True, top_logprobs=2, seed=1),
        SamplingParams(temperature=1.0),
    ]
    out = sample_batch(logits, params, [None, _gen(1), None], [[]] * 3, [0] * 3)
    ref = torch.log_softmax(apply_logit_bias(logits, params), dim=-1)
    for b in (0, 1):
        chosen, tops = out.logprobs[b], out.top_logprobs[b]
        assert chosen == pytest.approx(float(ref[b, out.token_ids[b]]), abs=1e-5)
        assert tops is not None and len(tops) == params[b].top_logprobs
        assert [t for t, _ in tops] == torch.topk(ref[b], len(tops)).indices.tolist()
        assert sum(np.exp(v) for _, v in tops) <= 1.0 + 1e-6
    greedy_tops = out.top_logprobs[0]
    assert greedy_tops is not None and greedy_tops[0] == (out.token_ids[0], pytest.approx(out.logprobs[0]))
    assert out.logprobs[2] is None and out.top_logprobs[2] is None


def test_seeded_request_samples_the_same_alone_and_in_a_batch() -> None:
    target = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, repetition_penalty=1.2, seed=1234)
    others = [
        SamplingParams(),
        SamplingParams(temperature=0.9, top_p=0.95, top_k=50, repetition_penalty=1.2, seed=99),  # same group
        SamplingParams(temperature=1.3, min_p=0.05),
        SamplingParams(temperature=0.7, frequency_penalty=0.5, logit_bias={3: 2.0}),
    ]
    alone_gen, batch_gen = _gen(1234), _gen(1234)
    other_gens = [None, _gen(99), None, _gen(5)]
    alone: list[int] = []
    batched: list[int] = []
    rng = np.random.default_rng(3)
    for step in range(60):
        logits = torch.randn(5, 2000, generator=_gen(step)) * 2
        hist = [7, 8, 9, *alone]
        alone += sample_batch(logits[:1], [target], [alone_gen], [hist], [3]).token_ids
        at = int(rng.integers(0, 5))  # the target's row moves around the batch
        rows = [logits[0] if i == at else logits[1 + i - (i > at)] for i in range(5)]
        params = others[:at] + [target] + others[at:]
        gens = other_gens[:at] + [batch_gen] + other_gens[at:]
        hists: list[list[int]] = [[1, 2]] * 5
        hists[at], counts = [7, 8, 9, *batched], [1] * 5
        counts[at] = 3
        batched.append(sample_batch(torch.stack(rows), params, gens, hists, counts).token_ids[at])
    assert alone == batched and len(set(alone)) > 10


def test_sample_batch_checks_lengths() -> None:
    with pytest.raises(ValueError, match="2 rows"):
        sample_batch(torch.zeros(2, 5), [SamplingParams()], [None], [[]], [0])


def test_params_are_frozen_and_hashable() -> None:
    a = SamplingParams(logit_bias={5: 1.0, 2: -1.0}, stop=["x"], stop_token_ids=[3])  # type: ignore[arg-type]
    b = SamplingParams(logit_bias={2: -1.0, 5: 1}, stop=("x",), stop_token_ids=(3,))
    assert a == b and hash(a) == hash(b) and a.stop == ("x",) and dict(a.logit_bias) == {2: -1.0, 5: 1.0}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -1}, "temperature is -1"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0}, r"top_p is 0; it must be in \(0, 1\]"),
        ({"top_k": -2}, "top_k is -2; use 0 to disable"),
        ({"max_tokens": 0}, "max_tokens is 0; it must be at least 1"),
        ({"min_p": 1.5}, r"min_p is 1.5; it must be in \[0, 1\]"),
        ({"presence_penalty": 3}, r"presence_penalty is 3; it must be in \[-2, 2\]"),
        ({"frequency_penalty": -2.5}, "frequency_penalty is -2.5"),
        ({"repetition_penalty": 0}, "repetition_penalty is 0; it must be in \\[0.01, 100\\]"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {4: float("nan")}}, "logit_bias"),
        ({"logprobs": True, "top_logprobs": 21}, r"top_logprobs is 21; it must be in \[0, 20\]"),
        ({"top_logprobs": 2}, "set logprobs=True"),
        ({"stop": ("",)}, "stop"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids"),
    ],
)
def test_bad_params_are_named(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_max_new_tokens() -> None:
    assert max_new_tokens(SamplingParams(max_tokens=None), 30, 100) == 70
    assert max_new_tokens(SamplingParams(max_tokens=70), 30, 100) == 70
    too_many = "prompt is 30 tokens and max_tokens is 71.*context of 100.*at most 70"
    with pytest.raises(ValueError, match=too_many):
        max_new_tokens(SamplingParams(max_tokens=71), 30, 100)
    with pytest.raises(ValueError, match="prompt is 100 tokens, which leaves no room.*context of 100"):
        max_new_tokens(SamplingParams(max_tokens=None), 100, 100)
