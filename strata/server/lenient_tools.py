"""Tool-call parsing that also accepts a bare call object, as small Qwen models write it.

Asked to call a tool, Qwen2.5-Coder-0.5B answers `{"name": "get_weather", "arguments": {...}}` without
the `<tool_call>` tags its template asks for. With tools on, an answer that opens with `{"name"` is
parsed as a call (the parser accepts a complete object left unclosed at the end); if it does not
parse, its text comes back unchanged, without the tag added to try it.
"""

from __future__ import annotations

from collections.abc import Callable

from strata.server import tool_parser as tp

_BARE_CALL = '{"name"'
_INJECTED = tp.OPEN_TAG + "\n"


class LenientToolCallParser:
    """`ToolCallParser`'s interface (`feed`, `finish`), plus bare call objects at the answer's start."""

    def __init__(self, tools_enabled: bool, id_factory: Callable[[], str] = tp.new_call_id) -> None:
        self.parser = tp.ToolCallParser(tools_enabled=tools_enabled, id_factory=id_factory)
        self._head: str | None = "" if tools_enabled else None  # the answer's start, until decided
        self._injected = False  # the tag was added to a bare call: strip it again if the call fails

    def feed(self, text: str) -> list[tp.Delta]:
        if self._head is not None:
            self._head += text
            head = self._head.lstrip()
            if _BARE_CALL.startswith(head):
                return []  # undecided yet
            text, self._head = self._head, None
            if head.startswith(_BARE_CALL):
                text, self._injected = _INJECTED + head, True
        return self._untag(self.parser.feed(text)) if text else []

    def finish(self) -> list[tp.Delta]:
        held, self._head = self._head or "", None
        return self._untag(self.parser.feed(held) + self.parser.finish())

    def _untag(self, deltas: list[tp.Delta]) -> list[tp.Delta]:
        if not self._injected:
            return deltas
        out: list[tp.Delta] = []
        for delta in deltas:
            if self._injected and isinstance(delta, tp.TextDelta):
                self._injected = False
                if delta.text.startswith(_INJECTED):  # the failed bare call's raw text
                    delta = tp.TextDelta(delta.text[len(_INJECTED) :])
            elif isinstance(delta, tp.ToolCallEnd):  # the bare call parsed: nothing left to strip
                self._injected = False
            out.append(delta)
        return out
