"""A streaming parser for Hermes/Qwen tool calls.

The model writes ``<tool_call>\\n{"name": "fn", "arguments": {...}}\\n</tool_call>``, often after prose.
Feed the model's text deltas; get `TextDelta`s and, per call, `ToolCallStart`, `ToolArgumentsDelta`s and
`ToolCallEnd`, or a `ToolCallParseError`. What the API adapters rely on:

* Indices count started calls from 0 without gaps. A call starts once ``{"name": "...", "arguments": {``
  has arrived; its arguments then stream as they arrive, and one index's fragments concatenate to exactly
  the arguments' JSON text. Other shapes (``arguments`` first, string arguments, no arguments: ``{}``) are
  buffered to the closing tag, then emitted as Start, one fragment, End.
* A malformed call yields `ToolCallParseError` then a `TextDelta` of its raw text, tags included, and
  counts in `num_parse_failures`. ``started=False``: nothing of it went out and its index is not used up;
  ``started=True``: its Start and some fragments went out, and the adapter must abandon that call.
* ``</tool_call>`` ends a call only outside JSON strings (arguments may hold that text), unless the JSON
  can no longer be valid (raw newline in a string, stray bare word, mismatched bracket): then the first
  closing tag anywhere ends it, as vLLM's Hermes regex would. At `finish`, complete valid JSON lacking
  the closing tag (EOS right after the object) is accepted, as vLLM does; anything incomplete is an error.
* ``<tool_call>`` opens a call only outside Markdown code (fences; inline spans, which here end at a
  newline so a stray backtick cannot hide the next line's call) and only when ``{`` follows after optional
  whitespace. Whitespace right after a successful call is dropped: newlines between calls are not text.
* Names outside `known_names` are still parsed, with ``ToolCallStart.known=False``: the adapter decides.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
_WS = " \t\r\n"
_ID_ALPHABET = string.ascii_letters + string.digits
# The only shape that streams: the name first, then the arguments object.
_STR = r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'  # a JSON string: json.loads accepts it
_HEAD = re.compile(r'\{\s*"name"\s*:\s*(' + _STR + r')\s*,\s*"arguments"\s*:\s*\{')
_BARE = frozenset(_WS + ",:0123456789+-.eEtruefalsn")  # what may stand outside strings in JSON
_OPENER = {"}": "{", "]": "["}


@dataclass(frozen=True)
class TextDelta:
    """Prose (or the raw text of a malformed call) to show as the message content."""

    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """A call begins: its index in this turn, a fresh id and the function name."""

    index: int
    id: str
    name: str
    known: bool = True  # False when known_names was given and lacks this name


@dataclass(frozen=True)
class ToolArgumentsDelta:
    """The next characters of a call's arguments JSON."""

    index: int
    json_fragment: str


@dataclass(frozen=True)
class ToolCallEnd:
    """The call is complete; its fragments concatenated are valid JSON of an object."""

    index: int


@dataclass(frozen=True)
class ToolCallParseError:
    """A malformed call; a `TextDelta` of `raw_text` follows. `index`: the call's, or the next one's."""

    index: int
    raw_text: str
    message: str
    started: bool = False


Delta = TextDelta | ToolCallStart | ToolArgumentsDelta | ToolCallEnd | ToolCallParseError


def new_call_id() -> str:
    """An OpenAI-style tool call id: ``call_`` and 24 random alphanumerics."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


class _Markdown:
    """Just enough CommonMark to tell whether the next prose character is inside code."""

    def __init__(self) -> None:
        self.fence = self.inline = self.run = 0  # open fence / inline span backtick counts; pending run
        self.line_start, self.run_at_line_start = True, False

    def push(self, ch: str) -> None:
        if ch == "`":
            if not self.run:
                self.run_at_line_start = self.line_start
            self.run, self.line_start = self.run + 1, False
            return
        self.settle()
        if ch == "\n":
            self.line_start, self.inline = True, 0
        elif ch not in " \t":
            self.line_start = False

    def settle(self) -> None:
        # A backtick run's meaning depends on its length, known once a non-backtick follows.
        n, self.run = self.run, 0
        if not n:
            return
        if self.fence or self.inline:  # a fence closes on a line-start run as long, a span on an equal run
            if (self.fence and self.run_at_line_start and n >= self.fence) or n == self.inline:
                self.fence = self.inline = 0
        elif self.run_at_line_start and n >= 3:
            self.fence = n
        else:
            self.inline = n

    def in_code(self) -> bool:
        self.settle()
        return bool(self.fence or self.inline)


class _JsonShape:
    """Strings and bracket nesting of JSON text, char by char; `doomed` once it cannot be valid JSON."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.in_string = self.escape = self.doomed = self.closed = False

    def push(self, ch: str) -> None:
        if self.in_string:
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.in_string = False
            elif ch < " ":  # raw control characters never occur inside a valid JSON string
                self.doomed = True
        elif self.closed and ch not in _WS:
            self.doomed = True
        elif ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.stack.append(ch)
        elif ch in "}]":
            if not self.stack or self.stack.pop() != _OPENER[ch]:
                self.doomed = True
            self.closed = not self.stack
        elif ch not in _BARE:
            self.doomed = True


def _validate(text: str) -> tuple[str, str] | str:
    """``(name, arguments JSON text)`` of a complete call body, or why it is not a tool call."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return f"tool call is not valid JSON: {e}"
    if not isinstance(obj, dict):
        return "tool call JSON is not an object"
    name, args = obj.get("name"), obj.get("arguments")
    if not isinstance(name, str) or not name:
        return 'tool call has no "name" string'
    if isinstance(args, str):  # some models encode the arguments as a JSON string
        try:
            ok = isinstance(json.loads(args), dict)
        except json.JSONDecodeError:
            ok = False
        return (name, args) if ok else '"arguments" is a string but not a JSON object'
    if args is not None and not isinstance(args, dict):
        return '"arguments" is not an object'
    return name, json.dumps(args or {}, ensure_ascii=False)


@dataclass
class _Call:
    prefix: str  # the opening tag and the whitespace after it
    body: str  # from the "{" on
    shape: _JsonShape = field(default_factory=_JsonShape)
    scanned: int = 0
    mode: Literal["head", "stream", "buffer"] = "head"
    index: int = -1
    args_start: int = 0  # stream mode: the arguments' text is body[args_start:args_end]
    args_end: int | None = None
    streamable: int = 0  # arguments text up to here may be emitted; emitted up to `sent`
    sent: int = 0


class ToolCallParser:
    """Turns one turn's streamed model text into text and tool call deltas (see the module docstring)."""

    def __init__(
        self,
        tools_enabled: bool = True,
        known_names: Iterable[str] | None = None,
        id_factory: Callable[[], str] = new_call_id,
    ) -> None:
        self.tools_enabled = tools_enabled
        self.known_names = None if known_names is None else frozenset(known_names)
        self._new_id = id_factory
        self.num_parse_failures = 0
        self.num_calls = 0  # calls started so far: the next call's index
        self._text = ""  # prose held back: it might still open a call
        self._md = _Markdown()
        self._call: _Call | None = None
        self._strip_ws = False
        self._out: list[Delta] = []

    def feed(self, text_delta: str) -> list[Delta]:
        """Add the next piece of model output; return the deltas it completes."""
        if not self.tools_enabled:
            return [TextDelta(text_delta)] if text_delta else []
        if self._call is None:
            self._text += text_delta
        else:
            self._call.body += text_delta
        return self._run(final=False)

    def finish(self) -> list[Delta]:
        """End of output: release held text and settle an open call."""
        return self._run(final=True) if self.tools_enabled else []

    def _run(self, final: bool) -> list[Delta]:
        while self._scan_text(final) if self._call is None else self._advance_call(final):
            pass
        out, self._out = self._out, []
        return out

    def _emit_text(self, text: str) -> None:
        if not text:
            return
        if self._out and isinstance(last := self._out[-1], TextDelta):
            self._out[-1] = TextDelta(last.text + text)
        else:
            self._out.append(TextDelta(text))

    def _scan_text(self, final: bool) -> bool:
        """Emit prose up to a call (True: the call is open now) or up to a possible tag prefix (False)."""
        text = self._text
        if self._strip_ws:
            text = text.lstrip(_WS)
            self._strip_ws = not text
        i = 0
        while i < len(text):
            if text[i] == "<" and not self._md.in_code():
                if text.startswith(OPEN_TAG, i):
                    j = i + len(OPEN_TAG)
                    while j < len(text) and text[j] in _WS:
                        j += 1
                    if j < len(text) and text[j] == "{":
                        self._emit_text(text[:i])
                        self._call, self._text = _Call(text[i:j], text[j:]), ""
                        return True
                    if j == len(text) and not final:
                        break  # whitespace so far: the "{" may still come
                elif OPEN_TAG.startswith(text[i:]) and not final:
                    break
            self._md.push(text[i])
            i += 1
        self._emit_text(text[:i])
        self._text = text[i:]
        return False

    def _advance_call(self, final: bool) -> bool:
        """Scan the open call; True once it is closed (prose after it is in `_text` again)."""
        c = self._call
        assert c is not None
        body, p, end = c.body, c.scanned, -1
        while p < len(body):
            if body[p] == "<" and (c.shape.doomed or not c.shape.in_string):
                if body.startswith(CLOSE_TAG, p):
                    end = p
                    break
                if CLOSE_TAG.startswith(body[p:]) and not final:
                    break
            c.shape.push(body[p])
            p += 1
            if c.mode == "head" and len(c.shape.stack) == 2:  # the first nested value just opened
                self._decide(c, p - 1)
            if c.mode == "stream" and c.args_end is None and not c.shape.doomed:
                c.streamable = p
                if len(c.shape.stack) == 1:
                    c.args_end = p
        c.scanned = p
        if c.streamable > c.sent:
            self._out.append(ToolArgumentsDelta(c.index, body[c.sent : c.streamable]))
            c.sent = c.streamable
        if end < 0 and not final:
            return False
        stop = end + len(CLOSE_TAG) if end >= 0 else len(body)
        self._call, self._text = None, body[stop:]
        self._close(c, body[:end] if end >= 0 else body, c.prefix + body[:stop])
        return True

    def _decide(self, c: _Call, brace: int) -> None:
        """Stream when the call opens exactly as ``{"name": "...", "arguments": {``; else buffer it."""
        m = _HEAD.match(c.body)
        name = json.loads(m.group(1)) if m and m.end() == brace + 1 else ""
        if not name:
            c.mode = "buffer"
            return
        c.mode, c.args_start = "stream", brace
        c.streamable = c.sent = brace
        self._start(c, name)

    def _start(self, c: _Call, name: str) -> None:
        c.index, self.num_calls = self.num_calls, self.num_calls + 1
        known = self.known_names is None or name in self.known_names
        self._out.append(ToolCallStart(c.index, self._new_id(), name, known))

    def _close(self, c: _Call, json_text: str, raw: str) -> None:
        result = _validate(json_text)
        if isinstance(result, tuple) and c.mode == "stream":
            # Belt and braces: what was streamed must itself be the arguments' JSON.
            try:
                json.loads(json_text[c.args_start : c.args_end or 0])
            except json.JSONDecodeError:
                result = "streamed arguments are not valid JSON"
        if isinstance(result, str):
            self.num_parse_failures += 1
            started = c.mode == "stream"
            self._out.append(ToolCallParseError(c.index if started else self.num_calls, raw, result, started))
            self._emit_text(raw)
            return
        if c.mode != "stream":
            self._start(c, result[0])
            self._out.append(ToolArgumentsDelta(c.index, result[1]))
        self._out.append(ToolCallEnd(c.index))
        self._strip_ws, self._md.line_start = True, True
