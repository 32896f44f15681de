"""Reasoning over the live server: a think-block template on the default model, budgets enforced.

The default model does not think, so these tests serve it with strata's `chatml-think` template (the
generation prompt opens `<think>`): whatever it writes first is reasoning, until the budget's wrap-up
closes the block and the answer follows in the same sequence.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from strata.prompt.chat_template import ChatTemplate
from strata.server.app import create_app
from strata.server.chat_service import ChatService
from strata.server.config import ServerConfig
from strata.server.model_config import ModelServingConfig
from strata.server.runtime import Runtime
from strata.server.thinking import ThinkingPolicy, ThinkingRequest
from tests.live_server import SERVED_MODEL, serving

WRAP = "time to answer."  # the end of the default wrap-up sentence
ASK = [{"role": "user", "content": "What is 2 + 3? Answer with one number."}]
GREEDY: dict[str, Any] = {"temperature": 0}


@pytest.fixture(scope="module")
def think_url(runtime: Runtime) -> Iterator[str]:
    """A second app over the shared engine: same weights, a thinking template."""
    tokenizer = runtime.llm.tokenizer
    template = ChatTemplate.builtin("chatml-think", eos_token=tokenizer.id_to_piece(tokenizer.eos_id or 0))
    config = ServerConfig(model_name=SERVED_MODEL)
    service = ChatService(
        runtime.engine, tokenizer, template, runtime.llm.spec.context_length, config, ModelServingConfig()
    )
    with serving(create_app(service, config)) as url:
        yield url


@pytest.fixture(scope="module")
def oai(think_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{think_url}/v1", api_key="unused", max_retries=0)


def test_openai_budget_wraps_up_and_the_answer_follows(oai: openai.OpenAI) -> None:
    out = oai.chat.completions.create(
        model=SERVED_MODEL,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=48,
        extra_body={"reasoning_budget_tokens": 6, **GREEDY},
    )
    message = out.choices[0].message
    reasoning = getattr(message, "reasoning_content", None) or ""
    print("reasoning:", repr(reasoning), "answer:", repr(message.content))
    assert reasoning.rstrip().endswith(WRAP)
    assert "</think>" not in reasoning and "<think>" not in (message.content or "")
    assert out.usage is not None and out.usage.completion_tokens > 6 + 10  # budget + wrap-up, then more
    assert message.content  # generation went on into the answer


def test_openai_stream_sends_reasoning_before_the_answer(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model=SERVED_MODEL,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=48,
        stream=True,
        extra_body={"reasoning_budget_tokens": 6, **GREEDY},
    )
    kinds, reasoning, content = [], [], []
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if getattr(delta, "reasoning_content", None):
            kinds.append("r")
            reasoning.append(delta.reasoning_content)  # type: ignore[attr-defined]
        if delta.content:
            kinds.append("c")
            content.append(delta.content)
    assert kinds and kinds[0] == "r" and "r" not in kinds[kinds.index("c") :]
    assert "".join(reasoning).rstrip().endswith(WRAP)
    whole = (
        oai.chat.completions.create(
            model=SERVED_MODEL,
            messages=ASK,
            max_tokens=48,
            extra_body={"reasoning_budget_tokens": 6, **GREEDY},
        )
        .choices[0]
        .message
    )
    assert "".join(content) == whole.content  # streamed and whole say the same


def test_thinking_off_writes_an_empty_block_and_no_budget(oai: openai.OpenAI) -> None:
    out = oai.chat.completions.create(
        model=SERVED_MODEL,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=12,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}, **GREEDY},
    )
    assert getattr(out.choices[0].message, "reasoning_content", None) is None
    assert out.choices[0].message.content


def test_anthropic_thinking_block_ends_with_the_wrap_up(think_url: str) -> None:
    client = anthropic.Anthropic(base_url=think_url, api_key="unused", max_retries=0)
    out = client.messages.create(
        model=SERVED_MODEL,
        max_tokens=48,
        messages=ASK,  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 6},
        extra_body=GREEDY,
    )
    kinds = [block.type for block in out.content]
    assert kinds[0] == "thinking" and "text" in kinds, kinds
    assert out.content[0].thinking.rstrip().endswith(WRAP)  # type: ignore[union-attr]
    with client.messages.stream(
        model=SERVED_MODEL,
        max_tokens=48,
        messages=ASK,  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 6},
        extra_body=GREEDY,
    ) as stream:
        streamed = stream.get_final_message()
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in out.content]


class _Tok:
    """Enough of a tokenizer for the policy: ids are characters."""

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def _policy(answer_room: bool = True) -> ThinkingPolicy:
    template = ChatTemplate.builtin("chatml-think")
    return ThinkingPolicy(template, _Tok(), ModelServingConfig(answer_room=answer_room))  # type: ignore[arg-type]


def test_answer_room_and_effort_budgets(caplog: pytest.LogCaptureFixture) -> None:
    policy, opened = _policy(), True  # the prompt opened the think block
    assert policy.opened([ord(c) for c in "assistant\n<think>\n"])
    assert not policy.opened([ord(c) for c in "assistant\n"])
    on = ThinkingRequest()
    with caplog.at_level(logging.INFO, logger="strata.server.thinking"):
        budgets = {n: policy.budget(on, opened, n) for n in (1023, 1024, 2048, 4096, 40_000)}
        policy.budget(on, opened, 4096)
    assert budgets[1023] is None
    assert {n: b.max_tokens for n, b in budgets.items() if b} == {
        1024: 512,
        2048: 1536,
        4096: 3072,
        40_000: 30_000,
    }
    assert all(b.starts_in_reasoning for b in budgets.values() if b)
    answer_room_logs = [
        r for r in caplog.records if r.getMessage().startswith("reasoning budget: answer room")
    ]
    assert len(answer_room_logs) == 1  # the decision is logged once, not per request
    assert _policy(answer_room=False).budget(on, opened, 4096) is None
    low = policy.budget(ThinkingRequest(effort="low"), opened, 4096)
    assert low is not None and low.max_tokens == 1024
    assert policy.budget(ThinkingRequest(effort="none"), opened, 4096) is None
    explicit = policy.budget(ThinkingRequest(budget_tokens=100), opened, 4096)
    assert explicit is not None and explicit.max_tokens == 100
    assert (
        policy.budget(ThinkingRequest(budget_tokens=5000), opened, 4096) is None
    )  # max_tokens ends it first
    assert policy.template_kwargs(ThinkingRequest(enabled=False)) == {"enable_thinking": False}
    assert policy.template_kwargs(ThinkingRequest()) == {}
    plain = ThinkingPolicy(ChatTemplate.builtin("chatml"), _Tok(), ModelServingConfig())  # type: ignore[arg-type]
    assert plain.budget(on, opened, 4096) is None  # no think block in the template: no budget


def test_bad_reasoning_fields_are_400s(oai: openai.OpenAI) -> None:
    for extra, match in [
        ({"reasoning_effort": "extreme"}, "reasoning_effort 'extreme' is not one of"),
        ({"reasoning_budget_tokens": -1}, "must be 0 or more"),
    ]:
        with pytest.raises(openai.BadRequestError, match=match):
            oai.chat.completions.create(model=SERVED_MODEL, messages=ASK, max_tokens=4, extra_body=extra)  # type: ignore[arg-type]
