"""Test data for protected rendering: special-token injections, conversations that carry them in every
external field, and chat templates in the styles real models use."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

CONTROL, USER_DEFINED = 3, 4
ZWJ = "\u200d"
_FULLWIDTH = str.maketrans({c: chr(ord(c) + 0xFEE0) for c in "<>|/_!"})


def special_tokens(metadata: Mapping[str, Any]) -> list[str]:
    """Every control and user-defined token string of a GGUF vocabulary (not the [PAD...] fillers)."""
    tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    return [t for t, kind in zip(tokens, types, strict=True) if kind in (CONTROL, USER_DEFINED)]


def injections(token: str, everything: str) -> dict[str, Callable[[str], str]]:
    """Ways to carry `token` in a field: name -> (field name -> the field's text).

    `everything` is all special tokens joined, for the repeated case; "split" puts the first half of
    the token at the end of one field and the rest at the start of the next one.
    """
    half = max(1, len(token) // 2)
    flip = iter(range(1 << 30))

    def split(field: str) -> str:
        return f"a {token[:half]}" if next(flip) % 2 == 0 else f"{token[half:]} b"

    return {
        "alone": lambda field: token,
        "embedded": lambda field: f"see {token} here",
        "repeated": lambda field: f"{token}{token}\n{everything}{token}",
        "split": split,
        "fullwidth": lambda field: token.translate(_FULLWIDTH),
        "zero_width_joiner": lambda field: token[:1] + ZWJ + token[1:half] + ZWJ + token[half:],
    }


def clean(field: str) -> str:
    return "clean"


def conversation(fill: Callable[[str], str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) using every kind of external text, each field's value `fill(field name)`."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": fill("tool name"),
                "description": fill("tool description"),
                "parameters": {
                    "type": "object",
                    "properties": {
                        fill("parameter name"): {
                            "type": "string",
                            "description": fill("parameter description"),
                        }
                    },
                    "required": [],
                },
            },
        }
    ]
    call_args = {fill("argument name"): fill("argument value")}
    messages = [
        {"role": "system", "content": fill("system")},
        {"role": "user", "content": fill("user"), "name": fill("user name")},
        {
            "role": "assistant",
            "content": fill("assistant"),
            "reasoning_content": fill("reasoning"),
            "tool_calls": [
                {"type": "function", "function": {"name": fill("call name"), "arguments": call_args}},
                {
                    "id": fill("call id"),
                    "type": "function",
                    "function": {
                        "name": fill("call name 2"),
                        "arguments": json.dumps({"q": fill("json arg")}),
                    },
                },
            ],
        },
        {"role": "tool", "content": fill("tool result"), "tool_call_id": fill("tool call id")},
        {"role": "tool", "content": fill("tool result 2")},
        {"role": "assistant", "content": fill("answer"), "reasoning_content": fill("reasoning 2")},
        {
            "role": "user",
            "content": [{"type": "text", "text": fill("part 1")}, {"type": "text", "text": fill("part 2")}],
        },
    ]
    return messages, tools


def injected_conversations(tokens: list[str]) -> Iterator[tuple[str, list[dict], list[dict]]]:
    """(case name, messages, tools) for every token and every way of injecting it."""
    everything = "".join(tokens)
    for token in tokens:
        for way, fill in injections(token, everything).items():
            yield (f"{token} {way}", *conversation(fill))


# Qwen3's template (as its tokenizer_config.json has it): reasoning replayed from `reasoning_content`
# or split out of the content at </think>, stripped, and `enable_thinking`.
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501 - kept as the model ships it

# In the style of newer Qwen and Gemma 3 templates: content rendered through a macro that loops over
# text parts (so parts reach the template as a list), trimmed, and tested with `in` afterwards.
MACRO_TEMPLATE = r"""{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for item in content | sort(attribute='type') -%}
            {%- if item['type'] == 'text' -%}
                {{- item['text'] | trim -}}
                {%- if not loop.last %} {% endif -%}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- for message in messages -%}
    {%- set content = render_content(message.content) -%}
    {%- if message.role == 'assistant' and '</think>' in content -%}
        {%- set content = content.split('</think>')[-1] | trim -%}
    {%- endif -%}
    {{- '<start_of_turn>' + message.role + '\n' + content + '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>assistant\n' -}}{%- endif -%}"""
