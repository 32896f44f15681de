"""Parsed model output (reasoning, text, Hermes tool calls) as OpenAI message deltas, streamed or whole."""

from __future__ import annotations

import json
from typing import Any

from strata.prompt.reasoning import ReasoningDelta, ReasoningSplitter
from strata.server.lenient_tools import LenientToolCallParser
from strata.server.openai import protocol as p
from strata.server.tool_parser import TextDelta, ToolArgumentsDelta, ToolCallParseError, ToolCallStart


class ChatOutput:
    """Feeds generated text through the reasoning splitter (for templates with a think block) and the
    tool-call parser; yields OpenAI deltas and keeps the totals."""

    def __init__(self, tools_enabled: bool, reasoning: bool = False, opened: bool = False) -> None:
        self.parser = LenientToolCallParser(tools_enabled=tools_enabled)
        self.splitter = ReasoningSplitter(starts_in_reasoning=opened) if reasoning else None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, p.ToolCall] = {}

    def feed(self, text: str) -> list[p.ChatDelta]:
        if not text:
            return []
        if self.splitter is None:
            return self._deltas(self.parser.feed(text))
        return self._split(self.splitter.feed(text))

    def finish(self) -> list[p.ChatDelta]:
        out = self._split(self.splitter.finish()) if self.splitter is not None else []
        return out + self._deltas(self.parser.finish())

    def _split(self, pieces: list[Any]) -> list[p.ChatDelta]:
        out: list[p.ChatDelta] = []
        for piece in pieces:
            if isinstance(piece, ReasoningDelta):
                self.reasoning.append(piece.text)
                out.append(p.ChatDelta(reasoning_content=piece.text))
            else:
                out += self._deltas(self.parser.feed(piece.text))
        return out

    def _deltas(self, parsed: list[Any]) -> list[p.ChatDelta]:
        out: list[p.ChatDelta] = []
        for delta in parsed:
            if isinstance(delta, TextDelta):
                self.content.append(delta.text)
                out.append(p.ChatDelta(content=delta.text))
            elif isinstance(delta, ToolCallStart):
                call = p.ToolCall(index=delta.index, id=delta.id, function=p.FunctionCall(name=delta.name))
                self.calls[delta.index] = call
                out.append(p.ChatDelta(tool_calls=[call.model_copy(deep=True)]))
            elif isinstance(delta, ToolCallParseError):
                # A call that broke after its start was streamed: the whole message drops it (its raw
                # text follows as content); a stream cannot take the streamed part back.
                self.calls.pop(delta.index, None)
            elif isinstance(delta, ToolArgumentsDelta):
                self.calls[delta.index].function.arguments += delta.json_fragment
                fragment = p.ToolCall(
                    index=delta.index, type=None, function=p.FunctionCall(arguments=delta.json_fragment)
                )
                out.append(p.ChatDelta(tool_calls=[fragment]))
        return out

    def message(self) -> p.ChatMessage:
        calls = [c.model_copy(update={"index": None}) for _, c in sorted(self.calls.items())]
        return p.ChatMessage(
            content="".join(self.content) or None,
            reasoning_content="".join(self.reasoning) or None,
            tool_calls=calls or None,
        )

    def finish_reason(self, engine_reason: str | None) -> str:
        if self.calls and engine_reason == "stop":
            return "tool_calls"
        return "length" if engine_reason == "length" else "stop"


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages as chat templates expect them: tool-call arguments as objects, not JSON text.

    OpenAI clients send `arguments` as a JSON string; Hermes-style templates write `arguments | tojson`
    and were trained on objects, so a string would be encoded twice.
    """
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not isinstance(calls, list):
            out.append(message)
            continue
        fixed = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                try:
                    args = json.loads(function["arguments"])
                except ValueError:
                    args = None
                if isinstance(args, dict):
                    call = {**call, "function": {**function, "arguments": args}}
            fixed.append(call)
        out.append({**message, "tool_calls": fixed})
    return out
