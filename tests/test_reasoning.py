"""ReasoningSplitter: think blocks out of streamed text, whatever the chunking."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from strata.prompt.reasoning import AnswerDelta, ReasoningDelta, ReasoningSplitter


def split(
    chunks: list[str], starts_in_reasoning: bool = False, **tags: str
) -> tuple[str, str, list[ReasoningDelta | AnswerDelta]]:
    """(reasoning, answer, all deltas) for text fed in these chunks."""
    s = ReasoningSplitter(starts_in_reasoning=starts_in_reasoning, **tags)
    deltas = [d for chunk in chunks for d in s.feed(chunk)] + s.finish()
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    assert s.reasoning_chars == len(reasoning)
    assert all(d.text for d in deltas), "no empty deltas"
    return reasoning, "".join(d.text for d in deltas if isinstance(d, AnswerDelta)), deltas


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def test_basic_split_strips_whitespace_after_tags() -> None:
    assert split(["<think>\nLet me think.\n</think>\n\nThe answer is 4."])[:2] == (
        "Let me think.\n",
        "The answer is 4.",
    )


def test_tags_split_across_every_chunk_boundary() -> None:
    text = "<think>\nhmm < not a tag </thin either\n</think>\n\n4 <think> stays"
    one = split([text])[:2]
    assert one == ("hmm < not a tag </thin either\n", "4 <think> stays")
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert split([text[:i], text[i:j], text[j:]])[:2] == one, (i, j)


def test_holds_back_only_a_possible_tag_prefix() -> None:
    s = ReasoningSplitter()
    assert s.feed("<think>abc</th") == [ReasoningDelta("abc")]
    assert s.in_reasoning
    assert s.feed("x") == [ReasoningDelta("</thx")]
    assert s.feed("</think>") == []
    assert not s.in_reasoning
    assert s.feed("\n") == []
    assert s.feed("Hi") == [AnswerDelta("Hi")]
    assert s.reasoning_chars == len("abc</thx")


def test_starts_in_reasoning() -> None:
    # Qwen3 with thinking on: the generation prompt already ends in "<think>\n".
    assert split(["Okay, 2+2.\n</thi", "nk>\n\n4"], starts_in_reasoning=True)[:2] == ("Okay, 2+2.\n", "4")
    assert ReasoningSplitter(starts_in_reasoning=True).in_reasoning
    # A model that repeats the opening tag anyway; and an empty think block.
    assert split(["<think>\nx</think>y"], starts_in_reasoning=True)[:2] == ("x", "y")
    assert split(["</think>\n\nanswer"], starts_in_reasoning=True)[:2] == ("", "answer")


def test_unterminated_reasoning_stays_reasoning() -> None:
    assert split(["<think>still going </thi"])[:2] == ("still going </thi", "")


def test_custom_tags() -> None:
    assert split(["[R]a[/R]b"], start_tag="[R]", end_tag="[/R]")[:2] == ("a", "b")


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("ab <>/thinké😀\n ")), max_size=40).filter(
        lambda t: not t.lstrip().startswith("<think>")
    ),
    st.lists(st.integers(0, 1000), max_size=8),
)
def test_no_think_output_passes_through_unchanged(text: str, cuts: list[int]) -> None:
    reasoning, answer, _ = split(chunked(text, cuts))
    assert (reasoning, answer) == ("", text)


pieces = st.sampled_from(["<think>", "</think>", "<", "</", "<th", "think>", "\n", " ", "x", "é", "😀", "ab"])


@settings(max_examples=300, deadline=None)
@given(st.lists(pieces, max_size=14).map("".join), st.lists(st.integers(0, 1000), max_size=8), st.booleans())
def test_rechunking_does_not_change_the_split(text: str, cuts: list[int], starts: bool) -> None:
    whole = split([text], starts)[:2]
    assert split(chunked(text, cuts), starts)[:2] == whole
    assert split(list(text), starts)[:2] == whole


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("ab <>/é😀\n")), max_size=30),
    st.text(alphabet=st.sampled_from(list("ab <>/thinké😀\n")), max_size=30),
    st.lists(st.integers(0, 1000), max_size=8),
)
def test_reasoning_and_answer_are_recovered(reasoning: str, answer: str, cuts: list[int]) -> None:
    text = f"<think>\n{reasoning}</think>\n\n{answer}"
    got = split(chunked(text, cuts))[:2]
    # Tags never leak; the only loss is whitespace right after a tag.
    assert got == (reasoning.lstrip(), answer.lstrip())
