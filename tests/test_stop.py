"""Stop strings and stop tokens on the real Qwen tokenizer: never a partial stop string or character."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.engine.sampler import SamplingParams
from strata.engine.stop import StopChecker, StopResult
from strata.gguf.reader import GGUFFile
from strata.prompt.tokenizer import Tokenizer

EOS = 151645  # <|im_end|>


@pytest.fixture(scope="module")
def tok(qwen_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(qwen_path).metadata)


@pytest.fixture(scope="module")
def byte_ids(tok: Tokenizer) -> dict[int, int]:
    """byte value -> the id of the token that is exactly that byte."""
    found: dict[int, int] = {}
    for i in range(tok.vocab_size):
        data = tok.token_bytes(i)
        if len(data) == 1:
            found.setdefault(data[0], i)
    assert len(found) == 256
    return found


def one(tok: Tokenizer, piece: str) -> int:
    ids = tok.encode(piece)
    assert len(ids) == 1, f"{piece!r} is {len(ids)} tokens here"
    return ids[0]


def run(checker: StopChecker, ids: list[int]) -> tuple[list[str], StopResult | None]:
    """Push ids until finished; the chunks emitted, and the finishing result (None: flushed)."""
    chunks = []
    for token in ids:
        result = checker.push(token)
        chunks.append(result.text)
        if result.finished:
            return chunks, result
    chunks.append(checker.flush())
    return chunks, None


def test_stop_string_over_two_tokens(tok: Tokenizer) -> None:
    ids = [one(tok, p) for p in ["Hello", " ST", "OP", " more"]]
    chunks, end = run(StopChecker(tok, ["STOP"]), ids)
    assert chunks == ["Hello", " ", ""]  # "ST" was held back, never shown
    assert end == StopResult("", True, "stop", "STOP")


def test_stop_string_over_three_tokens(tok: Tokenizer) -> None:
    ids = [one(tok, p) for p in ["x", " <", "END", ">", " y"]]
    chunks, end = run(StopChecker(tok, ["<END>"]), ids)
    assert chunks == ["x", " ", "", ""]
    assert end is not None and end.matched == "<END>" and end.reason == "stop"


def test_text_after_the_stop_string_in_the_same_token_is_dropped(tok: Tokenizer) -> None:
    ids = [one(tok, p) for p in ["Hello", " world", "!"]]
    chunks, end = run(StopChecker(tok, ["wor"]), ids)
    assert "".join(chunks) == "Hello " and end is not None and end.matched == "wor"


def test_stop_string_is_an_emoji_split_over_byte_tokens(tok: Tokenizer, byte_ids: dict[int, int]) -> None:
    emoji = [byte_ids[b] for b in "😀".encode()]
    ids = [one(tok, "ok"), one(tok, " "), *emoji, one(tok, " bye")]
    chunks, end = run(StopChecker(tok, ["😀"]), ids)
    assert chunks == ["ok", " ", "", "", "", ""]
    assert end is not None and end.matched == "😀"


def test_a_different_emoji_sharing_bytes_is_released_whole(tok: Tokenizer, byte_ids: dict[int, int]) -> None:
    grin = [byte_ids[b] for b in "😁".encode()]  # F0 9F 98 81: shares three bytes with 😀
    chunks, end = run(StopChecker(tok, ["😀"]), [*grin, one(tok, "!")])
    assert end is None and chunks == ["", "", "", "😁", "!", ""]


def test_stop_string_ending_inside_a_multibyte_character(tok: Tokenizer, byte_ids: dict[int, int]) -> None:
    # "é" arrives as two byte tokens; the stop string "café" only completes with the second.
    ids = [one(tok, "caf"), byte_ids[0xC3], byte_ids[0xA9], one(tok, " au")]
    chunks, end = run(StopChecker(tok, ["café"]), ids)
    assert chunks == ["", "", ""] and end is not None and end.matched == "café"
    chunks, end = run(StopChecker(tok, ["cafe"]), ids)  # no match: everything comes out, whole
    assert end is None and "".join(chunks) == "café au" and chunks[1] == ""


@pytest.mark.parametrize("stops", [["world", "lo w"], ["lo w", "world"]])
def test_earliest_stop_string_wins(tok: Tokenizer, stops: list[str]) -> None:
    ids = [one(tok, "Hello"), one(tok, " world")]
    chunks, end = run(StopChecker(tok, stops), ids)
    assert "".join(chunks) == "Hel" and end is not None and end.matched == "lo w"


def test_same_start_prefers_the_shorter(tok: Tokenizer) -> None:
    chunks, end = run(StopChecker(tok, ["Hello", "Hell"]), [one(tok, "Hello")])
    assert chunks == [""] and end is not None and end.matched == "Hell"


def test_held_back_text_is_released_when_the_match_fails(tok: Tokenizer) -> None:
    ids = [one(tok, p) for p in ["Hello", " ST", "ATE"]]
    chunks, end = run(StopChecker(tok, ["STOP"]), ids)
    assert end is None and chunks == ["Hello", " ", "STATE", ""]


def test_flush_releases_a_held_back_prefix(tok: Tokenizer) -> None:
    checker = StopChecker(tok, ["STOP"])
    assert [checker.push(t).text for t in [one(tok, "Hello"), one(tok, " ST")]] == ["Hello", " "]
    assert checker.flush() == "ST"
    assert checker.flush() == ""


def test_stop_tokens_finish_without_their_text(tok: Tokenizer) -> None:
    checker = StopChecker(tok, ["STOP"], stop_token_ids=[one(tok, "!")])
    assert checker.push(one(tok, "Hello")).text == "Hello"
    assert checker.push(one(tok, " ST")).text == " "
    assert checker.push(one(tok, "!")) == StopResult("ST", True, "stop", None)  # held text, not "!"
    with pytest.raises(RuntimeError, match="finished"):
        checker.push(one(tok, "Hello"))


def test_eos_unless_ignore_eos(tok: Tokenizer) -> None:
    hello = one(tok, "Hello")
    checker = StopChecker.for_params(tok, SamplingParams())
    assert checker.push(hello).text == "Hello" and checker.push(EOS).finished
    checker = StopChecker.for_params(tok, SamplingParams(ignore_eos=True, stop_token_ids=(hello,)))
    assert checker.push(EOS) == StopResult("<|im_end|>")
    assert checker.push(hello) == StopResult("", True, "stop", None)


def _tokens(tok: Tokenizer, byte_ids: dict[int, int], text: str, cuts: list[int]) -> list[int]:
    """`text` as tokens split at byte offsets `cuts`: ASCII pieces encoded, others byte by byte."""
    data, ids = text.encode(), []
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        piece = data[lo:hi]
        ids += tok.encode(piece.decode()) if piece.isascii() else [byte_ids[b] for b in piece]
    return ids


ALPHABET = "ab c\né😀"


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(ALPHABET, max_size=24),
    stop=st.text(ALPHABET, min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 200), max_size=12),
)
def test_output_is_the_text_up_to_the_first_stop(
    tok: Tokenizer, byte_ids: dict[int, int], text: str, stop: str, cuts: list[int]
) -> None:
    ids = _tokens(tok, byte_ids, text, cuts)
    full = tok.decode(ids)
    chunks, end = run(StopChecker(tok, [stop]), ids)
    emitted = "".join(chunks)
    assert all("\ufffd" not in c for c in chunks[: len(ids)])  # never half a character mid-stream
    if stop in full:
        assert end is not None and end.matched == stop and emitted == full[: full.index(stop)]
    else:
        assert end is None and emitted == full  # pushes + flush == decode(ids)
