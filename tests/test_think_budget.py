"""Reasoning budgets in the engine: the wrap-up lands in the same sequence and decoding continues."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from strata.engine.llm_engine import EngineConfig, LLMEngine
from strata.engine.sampler import SamplingParams
from strata.engine.think_budget import ThinkBudget, ThinkTracker
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.gguf.synth import SynthSpec, write_synthetic
from strata.models import build_model
from strata.prompt.tokenizer import Tokenizer

WRAP = tuple(b"Enough.</think>")  # the synthetic vocabulary is bytes: id == byte value


@pytest.fixture(scope="module")
def engine_parts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Tokenizer]]:
    path = write_synthetic(tmp_path_factory.mktemp("synth") / "qwen2.gguf", SynthSpec("qwen2"))
    gguf = GGUFFile(path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield build_model(gguf, ModelSpec.from_gguf(gguf)), Tokenizer.from_gguf(gguf.metadata)
    finally:
        torch.set_num_threads(threads)


def _engine(parts: tuple[object, Tokenizer]) -> LLMEngine:
    model, tokenizer = parts
    return LLMEngine(model, tokenizer, EngineConfig(num_blocks=64, block_size=4))  # type: ignore[arg-type]


def _find(haystack: list[int], needle: tuple[int, ...]) -> int:
    for i in range(len(haystack) - len(needle) + 1):
        if tuple(haystack[i : i + len(needle)]) == needle:
            return i
    return -1


@pytest.mark.parametrize("budget", [0, 3, 9])
def test_wrap_up_is_appended_and_decoding_continues_from_it(engine_parts, budget: int) -> None:
    prompt = [ord(c) for c in "Question? <think>"]
    params = SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=())
    engine = _engine(engine_parts)
    think = ThinkBudget(budget, WRAP, starts_in_reasoning=True)
    request = engine.add_request(prompt, params, think=think)
    while engine.has_unfinished():
        engine.step()
    out = request.output_ids
    at = _find(out, WRAP)
    assert at >= budget, f"wrap-up at {at}, budget {budget}: {bytes(out)!r}"
    # Up to the wrap-up the model ran as it would have without a budget...
    plain = _engine(engine_parts).generate([prompt], params)[0].output_ids
    assert out[:at] == plain[:at]
    # ...and after it, decoding continued from the appended tokens, exactly as a fresh prompt would.
    continued_prompt = prompt + out[: at + len(WRAP)]
    rest = SamplingParams(max_tokens=len(out) - at - len(WRAP), temperature=0.0, stop_token_ids=())
    expected = _engine(engine_parts).generate([continued_prompt], rest)[0].output_ids
    assert out[at + len(WRAP) :] == expected
    assert len(out) == 40
    assert engine.blocks.num_free_blocks == engine.config.num_blocks


def test_no_wrap_up_when_the_model_closes_the_block_itself() -> None:
    tracker = ThinkTracker(ThinkBudget(4, WRAP, starts_in_reasoning=True))
    for piece in ("a", "b", "</think>", "answer", "more", "more"):
        tracker.push(piece)
        assert not tracker.due()


def test_budget_waits_for_an_open_tool_call_to_close() -> None:
    tracker = ThinkTracker(ThinkBudget(2, WRAP, starts_in_reasoning=True))
    for piece in ("x", "<tool_", "call>{", '"a": 1', "}</tool"):
        tracker.push(piece)
        assert not tracker.due(), piece
    tracker.push("_call>")
    assert tracker.due()


def test_budget_counts_only_inside_the_block() -> None:
    tracker = ThinkTracker(ThinkBudget(2, WRAP))
    tracker.push("  ")
    tracker.push("<think>")
    assert not tracker.due()
    tracker.push("one")
    assert not tracker.due()  # the opening tag's own token does not count
    tracker.push("two")
    assert tracker.due()
    answered = ThinkTracker(ThinkBudget(0, WRAP))
    answered.push("no thinking here")
    assert not answered.due()


def test_budget_waits_while_a_tag_may_be_starting() -> None:
    tracker = ThinkTracker(ThinkBudget(1, WRAP, starts_in_reasoning=True))
    tracker.push("idea ")
    tracker.push("</thi")
    assert not tracker.due()
    tracker.push("ng")  # not the end tag after all
    assert tracker.due()


def test_a_sampling_failure_fails_the_request_and_the_engine_goes_on(engine_parts, monkeypatch) -> None:
    # (Here for the tiny-model fixture.) A raise in sampling once escaped step() and killed the loop.
    import strata.engine.llm_engine as engine_module

    engine = _engine(engine_parts)
    request = engine.add_request([1, 2, 3], SamplingParams(max_tokens=4))

    def broken(*args: object, **kwargs: object) -> None:
        raise IndexError("index -1 is out of bounds")

    with monkeypatch.context() as m:
        m.setattr(engine_module, "sample_batch", broken)
        events = engine.step()
    assert request.finish_reason == "error" and "sampling failed: IndexError" in (request.error or "")
    assert [e.finish_reason for e in events] == ["error"]
    assert engine.blocks.num_free_blocks == engine.config.num_blocks
    again = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4, stop_token_ids=()))[0]
    assert again.finish_reason == "length" and len(again.output_ids) == 4
