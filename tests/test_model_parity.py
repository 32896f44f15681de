"""The real packaged models against transformers' GGUF loader (float32): logits and greedy tokens.

For each prompt: the same argmax at every prompt position (the largest logit difference is printed)
and the same 32 greedy tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from strata.engine.llm import LLM, ModelConfig
from strata.engine.sampler import SamplingParams
from strata.model_store import resolve_model
from tests.hf_reference import hf_greedy, hf_logits, load_hf_model

pytestmark = pytest.mark.slow

# (name, text, through the chat template)
PROMPTS = {
    "qwen2.5-coder-0.5b": [
        ("coding chat", "Write a Python function that returns the n-th Fibonacci number, iteratively.", True),
        ("plain English", "The history of the printing press begins in the fifteenth century, when", False),
        ("CJK and emoji", "请用一句话解释递归 🤔, then say hello in Japanese: こんにちは 😀👍🏽", True),
    ],
    "gemma-3-270m": [
        ("code", "def is_prime(n: int) -> bool:\n    ", False),
        ("plain English", "The history of the printing press begins in the fifteenth century, when", False),
        ("CJK and emoji", "東京は日本の首都です。 The weather today is 🌧️ so", False),
    ],
}


@dataclass
class Pair:
    name: str
    ours: LLM
    ref: torch.nn.Module


@pytest.fixture(scope="module", params=sorted(PROMPTS))
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    path: Path = resolve_model(request.param, progress=False)
    yield Pair(request.param, LLM(ModelConfig(path)), load_hf_model(path))


def _ids(llm: LLM, text: str, chat: bool) -> list[int]:
    if chat:
        assert llm.chat_template is not None
        text = llm.chat_template.render([{"role": "user", "content": text}], add_generation_prompt=True)
        return llm.tokenizer.encode(text)
    return llm.tokenizer.encode(text, add_special=True)


@pytest.mark.parametrize("index", range(3))
def test_same_argmax_at_every_prompt_position(pair: Pair, index: int) -> None:
    label, text, chat = PROMPTS[pair.name][index]
    ids = _ids(pair.ours, text, chat)
    ours, ref = pair.ours.prompt_logits(ids), hf_logits(pair.ref, ids)
    diff = (ours - ref).abs().max().item()
    print(f"{pair.name} / {label}: {len(ids)} positions, max |logit diff| {diff:.3e}")
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    assert diff < 1e-2


@pytest.mark.parametrize("index", range(3))
def test_same_32_greedy_tokens(pair: Pair, index: int) -> None:
    label, text, chat = PROMPTS[pair.name][index]
    ids = _ids(pair.ours, text, chat)
    ours = list(pair.ours.generate(ids, SamplingParams(max_tokens=32)))
    ref = hf_greedy(pair.ref, ids, 32, pair.ours.tokenizer.eos_ids)
    print(f"{pair.name} / {label}: {pair.ours.tokenizer.decode(ours)!r}")
    assert ours == ref
    assert len(ours) == 32 or pair.ours.stats.finish_reason == "stop"
