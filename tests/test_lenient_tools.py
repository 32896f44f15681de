"""Bare call objects (no tags) are tool calls when tools are on; anything else is left as it was."""

from __future__ import annotations

import json

from strata.server import tool_parser as tp
from strata.server.lenient_tools import LenientToolCallParser

BARE = '  {"name": "get_weather", "arguments": {"city": "Paris"}}'


def _run(parser: LenientToolCallParser, pieces: list[str]) -> tuple[str, list[tuple[str, str]]]:
    deltas = [d for piece in pieces for d in parser.feed(piece)] + parser.finish()
    text = "".join(d.text for d in deltas if isinstance(d, tp.TextDelta))
    failed = {d.index for d in deltas if isinstance(d, tp.ToolCallParseError) and d.started}
    names = {d.index: d.name for d in deltas if isinstance(d, tp.ToolCallStart) and d.index not in failed}
    args: dict[int, str] = {}
    for d in deltas:
        if isinstance(d, tp.ToolArgumentsDelta):
            args[d.index] = args.get(d.index, "") + d.json_fragment
    return text, [(names[i], args.get(i, "")) for i in sorted(names)]


def test_bare_call_split_anywhere_is_a_call() -> None:
    for cut in range(1, len(BARE)):
        text, calls = _run(LenientToolCallParser(True), [BARE[:cut], BARE[cut:]])
        assert text == "" and [(n, json.loads(a)) for n, a in calls] == [("get_weather", {"city": "Paris"})]


def test_a_broken_bare_call_comes_back_unchanged() -> None:
    # Its start was streamed before it broke: the parse error abandons it, and the text is as written.
    broken = '{"name": "get_weather", "arguments": {"city": '
    text, calls = _run(LenientToolCallParser(True), [broken[:9], broken[9:]])
    assert text == broken and calls == []


def test_prose_and_tools_off_are_text() -> None:
    assert _run(LenientToolCallParser(True), ['{"nam', "e is a key"]) == ('{"name is a key', [])
    assert _run(LenientToolCallParser(True), ["Sure: ", BARE]) == ("Sure: " + BARE, [])
    assert _run(LenientToolCallParser(False), [BARE]) == (BARE, [])


FENCED = '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Paris"}\n}\n```'


def test_fenced_bare_call_split_anywhere_is_a_call() -> None:
    # Qwen2.5-Coder with its card's sampling often wraps the call in a Markdown fence.
    for cut in range(1, len(FENCED)):
        text, calls = _run(LenientToolCallParser(True), [FENCED[:cut], FENCED[cut:]])
        assert text.strip() == "", (cut, text)
        assert [(n, json.loads(a)) for n, a in calls] == [("get_weather", {"city": "Paris"})], cut


def test_a_broken_fenced_call_comes_back_unchanged_with_its_fence() -> None:
    broken = '```json\n{"name": "get_weather", "arguments": {"city": }\n```\nmore'
    for cut in (3, 9, 20, len(broken) - 6, len(broken) - 1):
        text, calls = _run(LenientToolCallParser(True), [broken[:cut], broken[cut:]])
        assert text == broken and calls == [], cut


def test_a_fence_around_other_json_is_text() -> None:
    other = '```json\n{"city": "Paris"}\n```'
    assert _run(LenientToolCallParser(True), [other]) == (other, [])
    assert _run(LenientToolCallParser(False), [FENCED]) == (FENCED, [])
