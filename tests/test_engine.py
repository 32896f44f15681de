"""The engine end to end on the real default model: batching, chunked prefill, prefix reuse and
preemption never change greedy tokens, and every block comes back."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.engine.llm import LLM, ModelConfig
from strata.engine.llm_engine import EngineConfig, LLMEngine
from strata.engine.sampler import SamplingParams
from strata.engine.scheduler import EngineBusy, SchedulerConfig

PROMPTS = [
    "def quicksort(xs):",
    "The three primary colours are",
    "SELECT name, COUNT(*) FROM users GROUP BY",
    "東京は",
    "A haiku about autumn leaves:\n",
    "import numpy as np\n\n# compute the mean of each column of a matrix\n",
    "Q: What is 17 * 23?\nA:",
    "<html><head><title>",
]
GREEDY = SamplingParams(max_tokens=10)


@pytest.fixture(scope="module")
def llm(qwen_path: Path) -> LLM:
    return LLM(ModelConfig(qwen_path))


@pytest.fixture(scope="module")
def alone(llm: LLM) -> list[list[int]]:
    """Each prompt through the single-sequence reference loop (contiguous KV, no engine)."""
    return [list(llm.generate(llm.tokenizer.encode(p), GREEDY)) for p in PROMPTS]


def _engine(llm: LLM, **kwargs: object) -> LLMEngine:
    scheduler = SchedulerConfig(**{k: kwargs.pop(k) for k in list(kwargs) if k.startswith("max_")})  # type: ignore[arg-type]
    return LLMEngine(llm.model, llm.tokenizer, EngineConfig(scheduler=scheduler, **kwargs))  # type: ignore[arg-type]


def _assert_all_returned(engine: LLMEngine) -> None:
    engine.blocks.check_invariants()
    assert engine.blocks.num_free_blocks == engine.config.num_blocks
    assert engine.scheduler.num_waiting == 0 and not engine.scheduler.running


def test_batch_with_chunked_prefill_equals_each_alone(llm: LLM, alone: list[list[int]]) -> None:
    engine = _engine(llm, num_blocks=128, block_size=4, max_num_batched_tokens=16)
    requests = engine.generate([llm.tokenizer.encode(p) for p in PROMPTS], GREEDY)
    for prompt, request, expected in zip(PROMPTS, requests, alone, strict=True):
        assert request.output_ids == expected, prompt
    _assert_all_returned(engine)


def test_preemption_under_a_small_pool_gives_the_same_tokens(llm: LLM, alone: list[list[int]]) -> None:
    engine = _engine(llm, num_blocks=24, block_size=4, max_num_batched_tokens=64, enable_prefix_cache=False)
    requests = engine.generate([llm.tokenizer.encode(p) for p in PROMPTS], GREEDY)
    assert engine.scheduler.num_preemptions > 0
    print(f"preemptions: {engine.scheduler.num_preemptions}")
    # Every preempted sequence comes back through admission once more.
    assert engine.scheduler.num_admissions == len(PROMPTS) + engine.scheduler.num_preemptions
    assert [r.output_ids for r in requests] == alone
    _assert_all_returned(engine)


def test_resent_conversation_reuses_every_full_block(llm: LLM) -> None:
    assert llm.chat_template is not None
    turns = [{"role": "user", "content": "Write a function that adds two numbers."}]
    first_ids = llm.tokenizer.encode(llm.chat_template.render(turns))
    engine = _engine(llm, num_blocks=256, block_size=8)
    first = engine.generate([first_ids], GREEDY)[0]
    turns += [
        {"role": "assistant", "content": llm.tokenizer.decode(first.output_ids)},
        {"role": "user", "content": "Now make it subtract."},
    ]
    second_ids = llm.tokenizer.encode(llm.chat_template.render(turns))
    second = engine.generate([second_ids], GREEDY)[0]
    # The first run's KV covers its prompt and every generated token but the last (never computed).
    computed = first_ids + first.output_ids[:-1]
    pairs = enumerate(zip(computed, second_ids, strict=False))
    shared = next((i for i, (a, b) in pairs if a != b), len(computed))
    assert shared >= len(first_ids)
    print(
        f"first prompt {len(first_ids)}, second {len(second_ids)}, shared prefix {shared}, "
        f"cached_tokens {second.cached_tokens}, miss at {second.cache_miss_position}"
    )
    assert second.cached_tokens == shared // 8 * 8
    # The block holding position `shared` was never full, so never cached: the miss is at its start.
    assert second.cache_miss_position == second.cached_tokens
    uncached = _engine(llm, num_blocks=256, block_size=8, enable_prefix_cache=False)
    assert uncached.generate([second_ids], GREEDY)[0].output_ids == second.output_ids
    _assert_all_returned(engine)


def test_seeded_sampling_alone_and_batched(llm: LLM) -> None:
    params = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, seed=1234)
    ids = llm.tokenizer.encode("Once upon a time")
    solo = _engine(llm).generate([ids], params)[0].output_ids
    batch = _engine(llm, max_num_batched_tokens=8)
    others = [
        batch.add_request(llm.tokenizer.encode(p), SamplingParams(max_tokens=6, temperature=1.0))
        for p in PROMPTS[:3]
    ]
    mine = batch.add_request(ids, params)
    while batch.has_unfinished():
        batch.step()
    assert mine.output_ids == solo and all(r.finished for r in others)


def test_abort_frees_blocks_at_the_next_step(llm: LLM) -> None:
    engine = _engine(llm, num_blocks=64, block_size=4)
    request = engine.add_request(llm.tokenizer.encode(PROMPTS[0]), SamplingParams(max_tokens=50))
    engine.step()
    assert engine.blocks.num_free_blocks < 64
    engine.abort(request.request_id)
    events = engine.step()
    assert request.finish_reason == "abort" and any(e.finish_reason == "abort" for e in events)
    _assert_all_returned(engine)


def test_a_full_waiting_queue_is_busy(llm: LLM) -> None:
    engine = _engine(llm, max_waiting=2)
    for _ in range(2):
        engine.add_request([1, 2, 3], GREEDY)
    with pytest.raises(EngineBusy, match="retry shortly"):
        engine.add_request([1, 2, 3], GREEDY)


def test_stop_strings_end_the_text_before_the_match(llm: LLM) -> None:
    engine = _engine(llm)
    ids = llm.tokenizer.encode("Count: 1, 2, 3, 4,")
    free_run = engine.generate([ids], SamplingParams(max_tokens=12))[0]
    text = llm.tokenizer.decode(free_run.output_ids)
    stop = text.strip()[3:6]  # a stop string that occurs in the greedy continuation
    request = engine.add_request(ids, SamplingParams(max_tokens=12, stop=(stop,)))
    pieces = []
    while engine.has_unfinished():
        pieces += [e.text for e in engine.step() if e.request_id == request.request_id]
    assert request.finish_reason == "stop"
    assert "".join(pieces) == text[: text.index(stop)]


def test_priority_runs_before_earlier_arrivals(llm: LLM) -> None:
    engine = _engine(llm, max_num_seqs=1)
    ids = llm.tokenizer.encode(PROMPTS[1])
    low = engine.add_request(ids, SamplingParams(max_tokens=2), priority=1)
    high = engine.add_request(ids, SamplingParams(max_tokens=2), priority=0)
    order = []
    while engine.has_unfinished():
        order += [e.request_id for e in engine.step() if e.finished]
    assert order == [high.request_id, low.request_id]
