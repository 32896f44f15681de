"""The chat a template renders: checking and normalizing it before any template sees it.

Both renderings (`ChatTemplate.render` and `render_prompt`) take their input through `prepare_chat`, so
they see exactly the same conversation. The rules:

- Each message is an object with a `role` of system, user, assistant or tool ("developer", OpenAI's
  newer name for system, is read as system). Keys whose value is None are dropped, as transformers
  does, since templates test for a missing key.
- `content` is a string or a list of text parts (`{"type": "text", "text": ...}`); it may be missing
  only on an assistant message that has `tool_calls`. A template that never loops over a message's
  content (Qwen2.5's does `'\\n' + message.content`) gets a part list as one string, the parts joined
  with "\\n" as vLLM and llama.cpp do; a template that loops over it gets the parts as they are.
- `tool_calls` (assistant only) hold a `function` with a string `name` and `arguments` as an object
  or a JSON string, passed on as given (transformers does not parse string arguments either).
- `name`, `tool_call_id` and `reasoning_content` are strings when present.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
_ROLE_ALIASES = {"developer": "system"}


class TemplateError(ValueError):
    """The chat is malformed, or the chat template failed to compile or render, called
    `raise_exception`, or (when protecting) did something with external text that strata cannot track."""


def plain_copy(value: Any) -> Any:
    """A copy of `value` made only of JSON-like builtins, so the template sees no foreign methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for kind in (str, int, float):
        if isinstance(value, kind):  # subclasses (enums, numpy floats) may carry extra methods
            return kind(value)
    if isinstance(value, Mapping):
        return {plain_copy(k): plain_copy(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(plain_copy(v) for v in value)
    if isinstance(value, list):
        return [plain_copy(v) for v in value]
    return f"<{type(value).__name__}>"


def prepare_chat(
    messages: Any, tools: Any, *, join_text_parts: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Checked, normalized plain copies of `messages` and `tools` (module docstring for the rules)."""
    if not isinstance(messages, list | tuple):
        raise TemplateError(f"messages must be a list of message objects, not {_kind(messages)}")
    chat = [_message(i, m, join_text_parts) for i, m in enumerate(messages)]
    if tools is None:
        return chat, None
    if not isinstance(tools, list | tuple):
        raise TemplateError(f"tools must be a list of tool objects, not {_kind(tools)}")
    for j, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise TemplateError(f"tool {j} must be an object, not {_kind(tool)}")
    return chat, [plain_copy(t) for t in tools]


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _message(i: int, message: Any, join_text_parts: bool) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise TemplateError(f"message {i} must be an object with a role and content, not {_kind(message)}")
    m = {k: v for k, v in plain_copy(message).items() if v is not None}
    for key in m:
        if not isinstance(key, str):
            raise TemplateError(f"message {i} has a field name that is not a string: {key!r}")
    role = m.get("role")
    if role not in ROLES and role not in _ROLE_ALIASES:
        raise TemplateError(
            f"message {i} has unknown role {role!r}; the roles are {', '.join(ROLES)} "
            "(developer is read as system)"
        )
    m["role"] = role = _ROLE_ALIASES.get(role, role)
    content = m.get("content")
    if content is None:
        if role != "assistant" or not m.get("tool_calls"):
            raise TemplateError(f"message {i} ({role}) has no content")
    elif isinstance(content, list):
        texts = [_part_text(i, j, part) for j, part in enumerate(content)]
        if join_text_parts:
            m["content"] = "\n".join(texts)
    elif not isinstance(content, str):
        raise TemplateError(
            f"message {i} ({role}): content must be a string or a list of text parts, not {_kind(content)}"
        )
    for key in ("name", "tool_call_id", "reasoning_content"):
        if key in m and not isinstance(m[key], str):
            raise TemplateError(f"message {i} ({role}): {key} must be a string, not {_kind(m[key])}")
    if "tool_calls" in m:
        if role != "assistant":
            raise TemplateError(f"message {i} ({role}): only assistant messages have tool_calls")
        _check_tool_calls(i, m["tool_calls"])
    return m


def _part_text(i: int, j: int, part: Any) -> str:
    where = f"message {i}, content part {j}"
    if not isinstance(part, dict):
        raise TemplateError(
            f"{where} must be an object like {{'type': 'text', 'text': ...}}, not {_kind(part)}"
        )
    if part.get("type") != "text":
        raise TemplateError(f"{where} has type {part.get('type')!r}; strata takes text parts only")
    text = part.get("text")
    if not isinstance(text, str):
        raise TemplateError(f"{where}: text must be a string, not {_kind(text)}")
    return text


def _check_tool_calls(i: int, calls: Any) -> None:
    if not isinstance(calls, list):
        raise TemplateError(f"message {i}: tool_calls must be a list, not {_kind(calls)}")
    for j, call in enumerate(calls):
        where = f"message {i}, tool call {j}"
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise TemplateError(f"{where} must be an object with a function, not {_kind(call)}")
        if not isinstance(function.get("name"), str):
            raise TemplateError(f"{where}: the function name must be a string")
        if not isinstance(function.get("arguments"), dict | str):
            raise TemplateError(
                f"{where}: arguments must be an object or a JSON string, "
                f"not {_kind(function.get('arguments'))}"
            )
