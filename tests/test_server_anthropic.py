"""The Anthropic Messages API on a live loopback server with the default model, driven by the official client;
and its request conversion and reply assembly as pure functions."""

from __future__ import annotations

import json
import time
from typing import Any
from unittest.mock import ANY

import anthropic
import httpx
import pytest

from strata.engine.llm_engine import TokenEvent
from strata.engine.sampler import SamplingParams
from strata.server.anthropic import protocol as p
from strata.server.anthropic.serving import _Blocks, _content, _Reply
from strata.server.app import create_app
from strata.server.chat_service import Prompt
from strata.server.config import ServerConfig
from strata.server.errors import APIError
from strata.server.runtime import Runtime
from strata.server.thinking import ThinkingRequest
from tests.live_server import SERVED_MODEL, serving

MODEL = SERVED_MODEL
HELLO: list[Any] = [{"role": "user", "content": "Write a Python function that returns the square of x."}]
GREEDY = {"temperature": 0}  # the 2.x client has no sampling arguments: they go in extra_body
WEATHER: Any = {
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
RAW_TYPES = {"message_start", "content_block_start", "content_block_delta", "content_block_stop"}
RAW_TYPES |= {"message_delta", "message_stop"}

_IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


def _user(*blocks: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def _t(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def _use(call_id: str, name: str, args: dict) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": args}


def _call(call_id: str, name: str, args: dict) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _request(**body: Any) -> p.MessagesRequest:
    return p.MessagesRequest.model_validate({"model": "m", "max_tokens": 10} | body)


@pytest.fixture(scope="module")
def client(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0)


def _create(client: anthropic.Anthropic, **kwargs: Any) -> anthropic.types.Message:
    args: dict[str, Any] = {
        "model": MODEL,
        "messages": HELLO,
        "max_tokens": 16,
        "extra_body": GREEDY,
    } | kwargs
    return client.messages.create(**args)


def _text(message: anthropic.types.Message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


@pytest.fixture(scope="module")
def plain(client: anthropic.Anthropic) -> anthropic.types.Message:
    return _create(client)


def test_plain_message(plain: anthropic.types.Message) -> None:
    assert plain.id.startswith("msg_") and plain.model == MODEL and plain.role == "assistant"
    assert [b.type for b in plain.content] == ["text"] and _text(plain)
    assert plain.stop_reason == "max_tokens" and plain.stop_sequence is None  # the answer is longer
    assert plain.usage.output_tokens == 16 and plain.usage.input_tokens > 0


def test_streamed_events_in_order_and_equal_to_plain(
    client: anthropic.Anthropic, plain: anthropic.types.Message
) -> None:
    with client.messages.stream(model=MODEL, messages=HELLO, max_tokens=16, extra_body=GREEDY) as stream:
        events = [e for e in stream if e.type in RAW_TYPES]
        final = stream.get_final_message()
    types = [e.type for e in events]
    deltas = len(types) - 5
    assert deltas >= 1
    assert types == ["message_start", "content_block_start"] + ["content_block_delta"] * deltas + [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    text = "".join(
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert text == _text(plain) == _text(final)
    assert final.stop_reason == plain.stop_reason and final.usage.output_tokens == plain.usage.output_tokens
    # The same prompt again: served from the prefix cache, and input + cache_read is still the prompt.
    assert final.usage.cache_read_input_tokens
    total = final.usage.input_tokens + final.usage.cache_read_input_tokens
    assert total == plain.usage.input_tokens + (plain.usage.cache_read_input_tokens or 0)


def test_system_prompt(client: anthropic.Anthropic) -> None:
    system = "You are a terse assistant. Answer in one word."
    count = client.messages.count_tokens(model=MODEL, messages=HELLO, system=system).input_tokens
    blocks: Any = [
        {"type": "text", "text": "You are a terse assistant."},
        {"type": "text", "text": "Answer in one word."},
    ]
    assert client.messages.count_tokens(model=MODEL, messages=HELLO, system=blocks).input_tokens == count
    assert count != client.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens
    out = _create(client, system=system, max_tokens=8)
    assert out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0) == count and _text(out)


def test_stop_sequence(client: anthropic.Anthropic, plain: anthropic.types.Message) -> None:
    free = _text(plain)
    stop = free[10:14]
    out = _create(client, stop_sequences=[stop, "never appears"])
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == stop
    assert _text(out) == free[: free.index(stop)]


def test_max_tokens(client: anthropic.Anthropic) -> None:
    out = _create(client, max_tokens=3)
    assert out.stop_reason == "max_tokens" and out.usage.output_tokens == 3


def test_count_tokens_equals_openai_prompt_tokens(client: anthropic.Anthropic, base_url: str) -> None:
    system = "Be brief."
    count = client.messages.count_tokens(model=MODEL, messages=HELLO, system=system).input_tokens
    openai_body = {"messages": [{"role": "system", "content": system}, *HELLO], "max_tokens": 1}
    usage = httpx.post(f"{base_url}/v1/chat/completions", json=openai_body, timeout=60).json()["usage"]
    assert count == usage["prompt_tokens"]


def test_thinking_and_sampling_fields_are_accepted(client: anthropic.Anthropic) -> None:
    # Qwen2.5's template has no thinking switch: thinking is accepted and changes nothing.
    thinking: Any = {"type": "enabled", "budget_tokens": 1}
    base = client.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens
    assert client.messages.count_tokens(model=MODEL, messages=HELLO, thinking=thinking).input_tokens == base
    extra = {"temperature": 0.7, "top_p": 0.9, "top_k": 40}
    out = _create(client, max_tokens=2, thinking=thinking, metadata={"user_id": "u1"}, extra_body=extra)
    assert out.usage.output_tokens <= 2


def test_tool_use_round_trip(client: anthropic.Anthropic) -> None:
    ask: Any = {"role": "user", "content": "What is the weather in Paris? Use the get_weather tool."}
    first = _create(client, messages=[ask], tools=[WEATHER], max_tokens=24)
    calls = [b for b in first.content if b.type == "tool_use"]
    print("first turn:", first.content, first.stop_reason)
    call: Any = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    if calls:  # the 0.5B model may or may not call the tool
        assert first.stop_reason == "tool_use"
        assert calls[0].id.startswith("toolu_") and calls[0].name == "get_weather"
        assert isinstance(calls[0].input, dict)
        call = calls[0].model_dump(include={"type", "id", "name", "input"})
        # Streamed, the call's input arrives as input_json_delta fragments that join to the same object.
        with client.messages.stream(
            model=MODEL, messages=[ask], tools=[WEATHER], max_tokens=24, extra_body=GREEDY
        ) as stream:
            fragments = [
                e.delta.partial_json
                for e in stream
                if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
            ]
            streamed = stream.get_final_message()
        assert fragments and json.loads("".join(fragments)) == calls[0].input
        assert streamed.stop_reason == "tool_use" and streamed.content[-1].type == "tool_use"
        assert streamed.content[-1].input == calls[0].input
    turns: Any = [
        ask,
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}, call]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "18C, sunny"}],
        },
    ]
    answer = _create(client, messages=turns, tools=[WEATHER], max_tokens=8)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.content
    print("answer:", answer.content)
    count = client.messages.count_tokens(model=MODEL, messages=turns, tools=[WEATHER]).input_tokens
    assert answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0) == count
    forced = client.messages.count_tokens(
        model=MODEL, messages=turns, tools=[WEATHER], tool_choice={"type": "any"}
    )  # generating with it is refused, counting is not
    assert forced.input_tokens == count


def test_client_disconnect_aborts_the_request(base_url: str, runtime: Runtime) -> None:
    # max_tokens beyond the context is clamped to the room left, as Anthropic's API allows it.
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 100_000, "stream": True}
    with httpx.stream("POST", f"{base_url}/v1/messages", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("event: content_block_delta"):
                assert runtime.engine.num_live() == 1
                break
    # Generating the whole answer would take many seconds; the abort lands within a step or two.
    deadline = time.monotonic() + 3
    while runtime.engine.num_live() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert runtime.engine.num_live() == 0


@pytest.mark.parametrize(
    "body, match",
    [
        ({"max_tokens": None}, "max_tokens: Field required"),
        ({"thinking": {"type": "enabled", "budget_tokens": 64}, "max_tokens": 64}, "less than max_tokens"),
        ({"tool_choice": {"type": "any"}, "tools": [WEATHER]}, "needs constrained decoding"),
        (
            {"tool_choice": {"type": "tool", "name": "get_weather"}, "tools": [WEATHER]},
            "needs constrained decoding",
        ),
        ({"messages": [{"role": "system", "content": [_use("t", "f", {})]}, *HELLO]}, "only text blocks"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ({"messages": []}, "messages is empty"),
        ({"messages": [*HELLO, {"role": "assistant", "content": "def"}]}, "prefilled assistant turn"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool"),
        ({"output_config": {"format": {"type": "json_schema", "schema": {}}}}, "needs constrained decoding"),
        ({"temperature": -1}, "temperature"),
        ({"stop_sequences": [""]}, "stop"),
    ],
)
def test_bad_requests_are_anthropic_shaped_400s(client: anthropic.Anthropic, body: dict, match: str) -> None:
    full = {"model": MODEL, "messages": HELLO, "max_tokens": 1} | body
    full = {k: v for k, v in full.items() if v is not None}  # None: leave the field out
    with pytest.raises(anthropic.BadRequestError, match=match) as info:
        client.post("/v1/messages", cast_to=object, body=full)
    error = info.value.body
    assert isinstance(error, dict) and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"


def test_count_tokens_errors_are_anthropic_shaped(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.post("/v1/messages/count_tokens", cast_to=object, body={"model": MODEL, "messages": "hi"})
    assert isinstance(info.value.body, dict) and info.value.body["type"] == "error"


def test_api_key_errors_are_anthropic_shaped(runtime: Runtime) -> None:
    app = create_app(runtime.service, ServerConfig(model_name=MODEL, api_key="sekret"))
    with serving(app) as url:
        wrong = anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as info:
            wrong.messages.count_tokens(model=MODEL, messages=HELLO)
        assert info.value.body == {"type": "error", "error": {"type": "authentication_error", "message": ANY}}
        keyed = anthropic.Anthropic(base_url=url, api_key="sekret", max_retries=0)  # sent as x-api-key
        assert keyed.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens > 0


# --- pure conversion and assembly -----------------------------------------------------------------------


def test_conversion_to_openai_shaped_chat() -> None:
    paris, rome = {"city": "Paris"}, {"city": "Rome"}
    results = [
        {"type": "tool_result", "tool_use_id": "toolu_a", "content": "18C"},
        {
            "type": "tool_result",
            "tool_use_id": "toolu_b",
            "content": [_t("21C"), _t("windy")],
            "is_error": False,
        },
        _t("Thanks!"),
    ]
    thought = {"type": "thinking", "thinking": "Two calls.", "signature": "sig"}
    req = _request(
        system=[_t("Be brief.") | {"cache_control": {"type": "ephemeral"}}, _t("Use tools.")],
        tools=[WEATHER, {"name": "noop", "input_schema": {"type": "object"}}],
        messages=[
            {"role": "user", "content": [_t("Weather in"), _t("Paris and Rome?")]},
            {
                "role": "assistant",
                "content": [
                    thought,
                    _t("Checking."),
                    _use("toolu_a", "get_weather", paris),
                    _use("toolu_b", "get_weather", rome),
                ],
            },
            {"role": "user", "content": results},
            {"role": "assistant", "content": [_use("toolu_c", "noop", {})]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_c"}]},
            {"role": "system", "content": [_t("Wrap up.")]},
            {"role": "user", "content": "Done?"},
        ],
    )
    chat = p.to_chat(req, SamplingParams(max_tokens=None), p.thinking_request(req))
    calls = [_call("toolu_a", "get_weather", paris), _call("toolu_b", "get_weather", rome)]
    assert chat.messages == [
        {"role": "system", "content": "Be brief.\nUse tools."},
        {"role": "user", "content": "Weather in\nParis and Rome?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Two calls.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "toolu_a", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_b", "content": "21C\nwindy"},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": None, "tool_calls": [_call("toolu_c", "noop", {})]},
        {"role": "tool", "tool_call_id": "toolu_c", "content": ""},
        {"role": "system", "content": "Wrap up."},
        {"role": "user", "content": "Done?"},
    ]
    weather = {
        "name": "get_weather",
        "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"],
    }
    noop = {"name": "noop", "parameters": {"type": "object"}}
    assert chat.tools == [{"type": "function", "function": weather}, {"type": "function", "function": noop}]
    assert list(chat.tools[0]["function"]) == list(weather)  # OpenAI's key order: templates dump it as is
    assert chat.template_kwargs == {}
    assert p.chat_tools(req.tools, p.ToolChoice(type="none")) is None
    thinking = req.model_copy(update={"thinking": p.Thinking(type="enabled", budget_tokens=2048)})
    assert p.thinking_request(thinking) == ThinkingRequest(enabled=True, budget_tokens=2048)
    assert p.thinking_request(req) == ThinkingRequest(enabled=False)


def test_images_are_dropped_and_counted_or_refused_naming_the_block() -> None:
    req = _request(messages=[{"role": "user", "content": [_t("x"), _IMAGE]}])
    assert p.chat_messages(req.system, req.messages, "drop") == ([{"role": "user", "content": "x"}], 1)
    with pytest.raises(APIError, match="message 0, content block 1 is an image"):
        p.chat_messages(req.system, req.messages, "refuse")
    nested = _request(
        messages=[_user({"type": "tool_result", "tool_use_id": "t", "content": [_t("r"), _IMAGE]})]
    )
    assert p.chat_messages(nested.system, nested.messages, "drop")[1] == 1
    with pytest.raises(APIError, match=r"\(tool_result\), block 1 is an image"):
        p.chat_messages(nested.system, nested.messages, "refuse")


def test_dropped_images_are_reported_in_the_reply(base_url: str) -> None:
    body = {"model": MODEL, "max_tokens": 2, "messages": [_user(_t("Describe:"), _IMAGE)], **GREEDY}
    r = httpx.post(f"{base_url}/v1/messages", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["warnings"] == ["dropped 1 image/file content part: this model reads text only"]
    assert "dropped 1 image" in r.headers["x-strata-warning"]


def _fold(blocks: _Blocks, chunks: list[str]) -> tuple[list[tuple[str, dict]], list[dict]]:
    events = [e for chunk in chunks for e in blocks.feed(chunk)] + blocks.finish()
    return events, _content(events, blocks.abandoned)


def test_blocks_stream_tool_use_and_fold_to_content() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    events, content = _fold(
        _Blocks(tools=True, starts_in_reasoning=False), [text[i : i + 7] for i in range(0, len(text), 7)]
    )
    starts = [e[1]["content_block"]["type"] for e in events if e[0] == "content_block_start"]
    assert starts == ["text", "tool_use"]
    fragments = [
        e[1]["delta"]["partial_json"] for e in events if e[0] == "content_block_delta" and e[1]["index"] == 1
    ]
    assert "".join(fragments) == '{"city": "Paris"}' and len(fragments) > 1  # streamed, not buffered
    assert [e[0] for e in events][-1] == "content_block_stop"
    assert content[0] == {"type": "text", "text": "Sure.\n"}
    assert content[1]["type"] == "tool_use" and content[1]["id"].startswith("toolu_")
    assert content[1]["name"] == "get_weather" and content[1]["input"] == {"city": "Paris"}


def test_blocks_thinking_then_text_and_no_whitespace_only_blocks() -> None:
    _, content = _fold(
        _Blocks(tools=True, starts_in_reasoning=False), ["<think>\nhm", "m</think>\n\nHi", "!"]
    )
    assert content == [
        {"type": "thinking", "thinking": "hmm", "signature": ""},
        {"type": "text", "text": "Hi!"},
    ]
    call = '\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n'
    _, content = _fold(_Blocks(tools=True, starts_in_reasoning=False), [call])
    assert [b["type"] for b in content] == ["tool_use"]
    _, content = _fold(_Blocks(tools=False, starts_in_reasoning=False), [call])
    assert content == [{"type": "text", "text": call}]


def test_blocks_take_bare_call_objects_as_tool_use() -> None:
    # Small Qwen models answer with the call object and no tags; with tools on that is a tool use.
    bare = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    _, content = _fold(_Blocks(tools=True, starts_in_reasoning=False), [bare[:3], bare[3:20], bare[20:]])
    assert [(b["type"], b.get("input")) for b in content] == [("tool_use", {"city": "Paris"})]
    broken = '{"name": "get_weather", "arguments": {"city": '
    _, content = _fold(_Blocks(tools=True, starts_in_reasoning=False), [broken])
    assert content == [{"type": "text", "text": broken}]  # not a call: the text comes back unchanged
    _, content = _fold(_Blocks(tools=False, starts_in_reasoning=False), [bare])
    assert content == [{"type": "text", "text": bare}]


def test_stop_reason_table(runtime: Runtime) -> None:
    tok, service = runtime.llm.tokenizer, runtime.service
    ids = tok.encode("Hello world, again")
    eos = next(iter(tok.eos_ids))

    def reply(events: list[TokenEvent], stops: tuple[str, ...] = (), tools: bool = False, **kw: Any) -> dict:
        r = _Reply(service, Prompt([1, 2, 3], kw.pop("limit", 16)), SamplingParams(stop=stops), tools, **kw)
        for e in events:
            r.push(e)
        return r.stop()

    def ev(token: int, text: str, reason: Any = None) -> TokenEvent:
        return TokenEvent("r", token, text, reason is not None, reason)

    hello = [ev(t, tok.decode([t])) for t in ids[:-1]]
    assert reply([*hello, ev(eos, "", "stop")], clamped=False) == {
        "stop_reason": "end_turn",
        "stop_sequence": None,
    }
    # The last token completed a stop string: its text was cut; which one is read from the decoded tail.
    cut = [ev(ids[0], "Hello"), ev(ids[1], "", "stop")]
    stopped = reply(cut, stops=(" wor", "zz"), clamped=False)
    assert stopped == {"stop_reason": "stop_sequence", "stop_sequence": " wor"}
    assert reply([ev(ids[0], "Hello", "length")], clamped=False)["stop_reason"] == "max_tokens"
    full = reply([ev(ids[0], "Hello", "length")], clamped=True, limit=1)
    assert full["stop_reason"] == "model_context_window_exceeded"
    call = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert reply([ev(1, call), ev(eos, "", "stop")], tools=True, clamped=False)["stop_reason"] == "tool_use"
