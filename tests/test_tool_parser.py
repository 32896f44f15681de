"""ToolCallParser: Hermes/Qwen tool calls out of streamed text, whatever the chunking."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from strata.server.tool_parser import (
    Delta,
    TextDelta,
    ToolArgumentsDelta,
    ToolCallEnd,
    ToolCallParseError,
    ToolCallParser,
    ToolCallStart,
)


def make_parser(**kwargs: Any) -> ToolCallParser:
    counter = iter(range(10**6))
    return ToolCallParser(id_factory=lambda: f"call_{next(counter)}", **kwargs)


def merged(deltas: list[Delta]) -> list[Delta]:
    """Adjacent text deltas and adjacent fragments of one call joined: what chunking may vary."""
    out: list[Delta] = []
    for d in deltas:
        last = out[-1] if out else None
        if isinstance(d, TextDelta) and isinstance(last, TextDelta):
            out[-1] = TextDelta(last.text + d.text)
        elif (
            isinstance(d, ToolArgumentsDelta)
            and isinstance(last, ToolArgumentsDelta)
            and d.index == last.index
        ):
            out[-1] = ToolArgumentsDelta(d.index, last.json_fragment + d.json_fragment)
        else:
            out.append(d)
    return out


def run(chunks: list[str], parser: ToolCallParser | None = None) -> list[Delta]:
    p = parser or make_parser()
    deltas = [d for chunk in chunks for d in p.feed(chunk)] + p.finish()
    assert all(d.text for d in deltas if isinstance(d, TextDelta)), "no empty text deltas"
    assert all(d.json_fragment for d in deltas if isinstance(d, ToolArgumentsDelta))
    return merged(deltas)


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def text_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, TextDelta))


def calls_of(deltas: list[Delta]) -> list[tuple[str, Any]]:
    """(name, parsed arguments) of every call that ended, from its concatenated fragments."""
    names = {d.index: d.name for d in deltas if isinstance(d, ToolCallStart)}
    frags: dict[int, str] = {}
    for d in deltas:
        if isinstance(d, ToolArgumentsDelta):
            frags[d.index] = frags.get(d.index, "") + d.json_fragment
    return [(names[d.index], json.loads(frags[d.index])) for d in deltas if isinstance(d, ToolCallEnd)]


def call(name: str, args: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def test_prose_then_one_call() -> None:
    deltas = run(["Let me check.\n", call("get_weather", {"city": "Paris"})])
    assert deltas == [
        TextDelta("Let me check.\n"),
        ToolCallStart(0, "call_0", "get_weather"),
        ToolArgumentsDelta(0, '{"city": "Paris"}'),
        ToolCallEnd(0),
    ]


def test_arguments_stream_before_the_closing_tag() -> None:
    p = make_parser()
    text = '<tool_call>\n{"name": "f", "arguments": {"a": "long text", "b": 2}}\n</tool_call>'
    seen: list[Delta] = []
    for i, ch in enumerate(text):
        seen += p.feed(ch)
        if text[: i + 1].endswith('"arguments": {'):
            assert seen == [ToolCallStart(0, "call_0", "f"), ToolArgumentsDelta(0, "{")]
    frags = [d for d in seen if isinstance(d, ToolArgumentsDelta)]
    assert len(frags) == len('{"a": "long text", "b": 2}')  # one per character fed
    assert seen[-1] == ToolCallEnd(0) and p.finish() == []


def test_several_calls_with_prose_between() -> None:
    text = "A.\n" + call("one", {"x": 1}) + "\n" + call("two", {}) + "\nThen B.\n\n" + call("three", [1])
    deltas = run(list(text))
    assert calls_of(deltas) == [("one", {"x": 1}), ("two", {})]
    assert [d.index for d in deltas if isinstance(d, ToolCallStart)] == [0, 1]
    err = [d for d in deltas if isinstance(d, ToolCallParseError)]
    assert len(err) == 1 and not err[0].started and err[0].index == 2  # arguments was a list
    assert text_of(deltas) == "A.\nThen B.\n\n" + call("three", [1])  # whitespace after a call dropped


def test_tricky_strings_in_arguments() -> None:
    args = {"q": '"{\\"a\\": \\"}\\"}"', "code": "`x` ```\n</tool_call> <tool_call>{", "é": "😀\u2028"}
    for ensure_ascii in (True, False):
        body = json.dumps({"name": "f", "arguments": args}, ensure_ascii=ensure_ascii)
        text = f"<tool_call>\n{body}\n</tool_call>"
        assert calls_of(run(list(text))) == calls_of(run([text])) == [("f", args)]


def test_tag_inside_code_or_not_followed_by_json_stays_text() -> None:
    for text in [
        "Use it like this:\n```xml\n" + call("f", {}) + "\n```\n",
        "~ `<tool_call>{` is the tag ~",
        "Write ``<tool_call>`{` then ``",
        "the <tool_call> tag and <tool_call>\n[1] and <tool_c",
    ]:
        p = make_parser()
        assert run(chunked(text, [5, 17, 30]), p) == [TextDelta(text)]
        assert p.num_parse_failures == 0
    # After a fence closes (and after a stray backtick's line ends), calls count again.
    text = "```\n<tool_call>{}\n```\nok `stray\n" + call("f", {})
    assert calls_of(run([text])) == [("f", {})]


def test_possible_tag_prefix_is_held_back_then_released() -> None:
    p = make_parser()
    assert p.feed("Hi <tool_c") == [TextDelta("Hi ")]
    assert p.feed("all") == []
    assert p.feed(">\n ") == []
    assert p.feed("no") == [TextDelta("<tool_call>\n no")]
    assert p.feed("<") == []
    assert p.finish() == [TextDelta("<")]


def test_malformed_json_is_an_error_with_the_raw_text() -> None:
    bad = '<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>'
    p = make_parser()
    deltas = run(["x ", bad, " y ", call("g", {"b": 2})], p)
    assert deltas[:3] == [
        TextDelta("x "),
        ToolCallStart(0, "call_0", "f"),
        ToolArgumentsDelta(0, '{"a": 1,}'),
    ]
    err = deltas[3]
    assert isinstance(err, ToolCallParseError) and err.started and err.index == 0 and err.raw_text == bad
    assert deltas[4] == TextDelta(bad + " y ")
    assert calls_of(deltas) == [("g", {"b": 2})]
    assert deltas[5] == ToolCallStart(1, "call_1", "g")  # a started call keeps its index
    assert p.num_parse_failures == 1


def test_broken_json_ends_at_the_first_closing_tag() -> None:
    # The unescaped quote leaves a "string" open; the raw newline in it shows the JSON is broken.
    bad = '<tool_call>\n{"name": "f", "arguments": {"a": "say "hi""}}\n</tool_call>'
    p = make_parser()
    deltas = run([bad + "\nafter"], p)
    assert [type(d) for d in deltas] == [ToolCallStart, ToolArgumentsDelta, ToolCallParseError, TextDelta]
    assert text_of(deltas) == bad + "\nafter" and p.num_parse_failures == 1


def test_unterminated_call_at_finish() -> None:
    p = make_parser()
    deltas = run(['ok <tool_call>\n{"name": "f", "arguments": {"a": '], p)
    assert isinstance(deltas[-2], ToolCallParseError) and p.num_parse_failures == 1
    assert text_of(deltas) == 'ok <tool_call>\n{"name": "f", "arguments": {"a": '
    # Complete JSON with the closing tag missing (EOS right after it) is accepted, as vLLM does.
    assert calls_of(run(['<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n'])) == [("f", {"a": 1})]


def test_other_shapes_are_buffered_into_one_fragment() -> None:
    text = '<tool_call>{"arguments": {"a": [1, "}"]}, "name": "f"}</tool_call>'
    deltas = run(list(text))
    assert deltas == [
        ToolCallStart(0, "call_0", "f"),
        ToolArgumentsDelta(0, '{"a": [1, "}"]}'),
        ToolCallEnd(0),
    ]
    as_string = '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
    assert run([as_string])[1] == ToolArgumentsDelta(0, '{"a": 1}')
    assert calls_of(run(['<tool_call>{"name": "now"}</tool_call>'])) == [("now", {})]
    p = make_parser()
    not_json = '<tool_call>{"name": "f", "arguments": "a=1"}</tool_call>'
    deltas = run([not_json], p)
    assert isinstance(deltas[0], ToolCallParseError) and not deltas[0].started and deltas[0].index == 0
    assert deltas[1:] == [TextDelta(not_json)] and p.num_parse_failures == 1


def test_known_names_disabled_tools_and_ids() -> None:
    deltas = run([call("f", {}) + call("g", {})], make_parser(known_names={"f"}))
    assert [(d.name, d.known) for d in deltas if isinstance(d, ToolCallStart)] == [("f", True), ("g", False)]
    p = ToolCallParser(tools_enabled=False)
    assert p.feed(call("f", {})) == [TextDelta(call("f", {}))] and p.finish() == []
    start = ToolCallParser().feed(call("f", {}))[0]
    assert isinstance(start, ToolCallStart) and re.fullmatch(r"call_[A-Za-z0-9]{24}", start.id)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(st.sampled_from(list('a"\\{}[]<>/`\n é😀'))),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
prose = st.text(st.sampled_from(list("ab {}\"'\n é😀<>/")), max_size=20)


@settings(max_examples=150, deadline=None)
@given(
    prose,
    st.lists(
        st.tuples(
            st.sampled_from(["f", "get_weather", "naïve"]),
            st.dictionaries(st.text(max_size=5), json_values, max_size=3),
            st.booleans(),
            prose,
        ),
        max_size=3,
    ),
    st.lists(st.integers(0, 10**4), max_size=12),
)
def test_calls_and_prose_are_recovered_under_any_chunking(
    head: str, calls: list[tuple[str, dict[str, Any], bool, str]], cuts: list[int]
) -> None:
    text, want_text = head, head
    for name, args, ascii_only, after in calls:
        body = json.dumps({"name": name, "arguments": args}, ensure_ascii=ascii_only)
        text += f"<tool_call>\n{body}\n</tool_call>{after}"
        want_text += after.lstrip()
    whole = run([text])
    assert run(chunked(text, cuts)) == whole
    assert calls_of(whole) == [(name, args) for name, args, _, _ in calls]
    assert text_of(whole) == want_text


# Fragments that often assemble into calls, broken calls, tags in code and near-miss tags.
pieces = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<tool_c", "{", "}", '"', '\\"', "\\", "```", "`", "\n", " ", "x", ":",
     '<tool_call>\n{"name": "f", "arguments": {', '"a": "}\\"{"', '"b": [1, {}]', "}}\n</tool_call>", "}}",
     '{"arguments": {}, "name": "g"}', '<tool_call>{"name": "h", "arguments": "x"}', "é😀", "[", "]", "1",
     ","]
)  # fmt: skip
segments = pieces | st.builds(
    call, st.sampled_from(["f", "g"]), st.dictionaries(st.text(max_size=3), json_values)
)


@settings(max_examples=300, deadline=None)
@given(st.lists(segments, max_size=12).map("".join), st.lists(st.integers(0, 10**4), max_size=10))
def test_rechunking_never_changes_the_result(text: str, cuts: list[int]) -> None:
    p = make_parser()
    whole = run([text], p)
    assert run(chunked(text, cuts)) == whole
    assert run(list(text)) == whole
    for start in (d for d in whole if isinstance(d, ToolCallStart)):
        assert start.index < p.num_calls
    if not any(isinstance(d, ToolCallEnd) for d in whole):
        assert text_of(whole) == text  # nothing lost when no call succeeded
    assert p.num_parse_failures == sum(isinstance(d, ToolCallParseError) for d in whole)
    for name, args in calls_of(whole):  # every successful call's fragments are its arguments' JSON
        assert isinstance(name, str) and isinstance(args, dict)
