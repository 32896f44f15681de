"""Tool-call parsing that also accepts a bare call object, as small Qwen models write it.

Asked to call a tool, Qwen2.5-Coder-0.5B answers `{"name": "get_weather", "arguments": {...}}` without
the `<tool_call>` tags its template asks for, and with its card's sampling (repetition penalty 1.05)
often inside a Markdown fence (```` ```json ````). With tools on, an answer that opens with `{"name"`,
or with a fence and then `{"name"`, is parsed as a call: the fence's closing backticks close the call,
and an unfenced object may be left unclosed at the end. If it does not parse, its text comes back
unchanged, fence included, without the tags added to try it.
"""

from __future__ import annotations

from collections.abc import Callable

from strata.server import tool_parser as tp

_BARE_CALL = '{"name"'
_FENCES = ("```json\n", "```\n")
_FENCE_END = "```"
_INJECTED = tp.OPEN_TAG + "\n"


def _call_start(head: str) -> tuple[str, bool | None]:
    """Whether `head` opens a bare call object (`{`, whitespace, `"name"`), maybe after a fence:
    (the fence, True / False), or None while it cannot be told yet."""
    fence = next((f for f in _FENCES if head.startswith(f)), "")
    if not fence and any(f.startswith(head) for f in _FENCES):
        return "", None
    rest = head[len(fence) :]
    if not rest:
        return fence, None
    if not rest.startswith("{"):
        return fence, False
    key = rest[1:].lstrip()
    if key.startswith(_BARE_CALL[1:]):
        return fence, True
    return fence, None if _BARE_CALL[1:].startswith(key) and len(rest) < 64 else False


class LenientToolCallParser:
    """`ToolCallParser`'s interface (`feed`, `finish`), plus bare call objects at the answer's start."""

    def __init__(self, tools_enabled: bool, id_factory: Callable[[], str] = tp.new_call_id) -> None:
        self.parser = tp.ToolCallParser(tools_enabled=tools_enabled, id_factory=id_factory)
        self._head: str | None = "" if tools_enabled else None  # the answer's start, until decided
        self._injected = ""  # what a bare call's text lost (its fence) while the tag stands in for it
        self._fenced = False  # inside a fenced bare call: its closing backticks close the call
        self._ticks = ""  # backticks held back in a fenced call (maybe the start of the closing fence)

    def feed(self, text: str) -> list[tp.Delta]:
        if self._head is not None:
            self._head += text
            head = self._head.lstrip()
            fence, verdict = _call_start(head)
            if verdict is None:
                return []  # undecided yet
            text, self._head = self._head, None
            if verdict and fence:
                text, self._injected, self._fenced = _INJECTED + head[len(fence) :], fence, True
            elif verdict:
                text, self._injected = _INJECTED + head, "\0"  # "\0": no fence, but the tag to strip
        if self._fenced:
            text = self._close_fence(text)
        return self._untag(self.parser.feed(text)) if text else []

    def _close_fence(self, text: str) -> str:
        text, self._ticks = self._ticks + text, ""
        end = text.find(_FENCE_END)
        if end >= 0:
            self._fenced = False
            return text[:end] + tp.CLOSE_TAG + text[end + len(_FENCE_END) :]
        keep = len(text) - len(text.rstrip("`"))
        text, self._ticks = text[: len(text) - keep], text[len(text) - keep :]
        return text

    def finish(self) -> list[tp.Delta]:
        held, self._head = (self._head or "") + self._ticks, None
        self._ticks = ""
        return self._untag(self.parser.feed(held) + self.parser.finish())

    def _untag(self, deltas: list[tp.Delta]) -> list[tp.Delta]:
        if not self._injected:
            return deltas
        out: list[tp.Delta] = []
        for delta in deltas:
            if self._injected and isinstance(delta, tp.TextDelta):
                fence, self._injected = self._injected.strip("\0"), ""
                if delta.text.startswith(_INJECTED):  # the failed bare call's raw text
                    raw = delta.text[len(_INJECTED) :]
                    delta = tp.TextDelta(fence + raw.replace(tp.CLOSE_TAG, _FENCE_END, 1) if fence else raw)
            elif isinstance(delta, tp.ToolCallEnd):  # the bare call parsed: nothing left to strip
                self._injected = ""
            out.append(delta)
        return out
