"""The sampler: greedy is argmax; top-k and top-p never pick outside their sets; seeds repeat."""

from __future__ import annotations

import pytest
import torch

from strata.engine.sampler import SamplingParams, sample


def test_greedy_is_argmax() -> None:
    logits = torch.randn(1000)
    assert sample(logits, SamplingParams()) == int(logits.argmax())


def test_top_k_stays_in_the_top_k() -> None:
    logits = torch.randn(500)
    allowed = set(torch.topk(logits, 5).indices.tolist())
    params = SamplingParams(temperature=2.0, top_k=5)
    gen = torch.Generator().manual_seed(0)
    picks = {sample(logits, params, gen) for _ in range(300)}
    assert picks <= allowed and len(picks) > 1


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    params = SamplingParams(temperature=1.0, top_p=0.7)  # 0.5 alone < 0.7, so {0, 1}
    gen = torch.Generator().manual_seed(0)
    picks = {sample(probs.log(), params, gen) for _ in range(300)}
    assert picks == {0, 1}


def test_tiny_top_p_is_greedy() -> None:
    logits = torch.randn(100)
    gen = torch.Generator().manual_seed(3)
    assert sample(logits, SamplingParams(temperature=1.0, top_p=1e-6), gen) == int(logits.argmax())


def test_seed_repeats() -> None:
    logits = torch.randn(2000)
    params = SamplingParams(temperature=1.0)
    a = [sample(logits, params, torch.Generator().manual_seed(7)) for _ in range(5)]
    b = [sample(logits, params, torch.Generator().manual_seed(7)) for _ in range(5)]
    assert a == b


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_bad_params_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
