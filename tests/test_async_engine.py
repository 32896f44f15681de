"""`AsyncEngine` on a tiny synthetic qwen2: streaming equals the synchronous engine, every way a
consumer can leave frees its KV blocks, errors reach the caller, and an idle loop sleeps."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from strata.engine.async_engine import AsyncEngine, EngineDead, ErrorEvent
from strata.engine.llm_engine import EngineConfig, LLMEngine, TokenEvent
from strata.engine.sampler import SamplingParams
from strata.engine.scheduler import EngineBusy, SchedulerConfig
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.gguf.synth import SynthSpec, write_synthetic
from strata.models import build_model
from strata.models.base import DecoderModel
from strata.prompt.tokenizer import Tokenizer

PROMPTS = [[(7 * i + 3 * j) % 256 for j in range(3 + 2 * i)] for i in range(8)]  # 3..17 tokens
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
LONG = SamplingParams(max_tokens=200, ignore_eos=True)  # never finishes within a test on its own


@dataclass(frozen=True)
class Tiny:
    model: DecoderModel
    tokenizer: Tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    path: Path = write_synthetic(tmp_path_factory.mktemp("async") / "qwen2.gguf", SynthSpec("qwen2"))
    gguf = GGUFFile(path)
    return Tiny(build_model(gguf, ModelSpec.from_gguf(gguf)), Tokenizer.from_gguf(gguf.metadata))


def _engine(tiny: Tiny, step_delay: float = 0.0, **scheduler: int) -> LLMEngine:
    config = EngineConfig(num_blocks=64, block_size=4, scheduler=SchedulerConfig(**scheduler))
    engine = LLMEngine(tiny.model, tiny.tokenizer, config)
    if step_delay:  # a slow GPU: keeps requests live long enough to act on them mid-stream
        step = engine.step
        engine.step = lambda: (time.sleep(step_delay), step())[1]  # type: ignore[method-assign]
    return engine


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


async def _collect(ae: AsyncEngine, prompt: list[int], params: SamplingParams, **kw: Any) -> list[TokenEvent]:
    return [event async for event in ae.generate(prompt, params, **kw)]


async def _settle(ae: AsyncEngine) -> None:
    """Until every request has come back and the engine thread waits for work."""
    while ae.num_live() or not ae.stats().idle:
        await asyncio.sleep(0.005)


def _assert_all_returned(engine: LLMEngine) -> None:
    # Read only once the engine thread is idle: it is the sole owner of the engine otherwise.
    engine.blocks.check_invariants()
    assert engine.blocks.num_free_blocks == engine.config.num_blocks
    assert engine.scheduler.num_waiting == 0 and not engine.scheduler.running


def test_concurrent_streams_equal_the_synchronous_engine(tiny: Tiny) -> None:
    expected = [r.output_ids for r in _engine(tiny).generate(PROMPTS, GREEDY)]
    engine = _engine(tiny, max_num_batched_tokens=16)  # chunked prefill while others decode

    async def main() -> list[list[TokenEvent]]:
        async with AsyncEngine(engine) as ae:
            jobs = [_collect(ae, p, GREEDY, request_id=f"r{i}") for i, p in enumerate(PROMPTS)]
            streams = await asyncio.gather(*jobs)
            await _settle(ae)
            _assert_all_returned(engine)
            return streams

    for i, (events, want) in enumerate(zip(_run(main()), expected, strict=True)):
        assert {e.request_id for e in events} == {f"r{i}"}
        assert [e.finished for e in events] == [False] * (len(events) - 1) + [True]
        assert events[-1].finish_reason == "length"
        assert [e.token_id for e in events if e.token_id is not None] == want


@pytest.mark.parametrize("how", ["break", "aclosing"])
def test_leaving_a_stream_early_aborts_it(tiny: Tiny, how: str) -> None:
    engine = _engine(tiny)

    async def main() -> None:
        with AsyncEngine(engine) as ae:
            if how == "break":  # the generator is finalized (and aborts) when it is dropped
                async for event in ae.generate(PROMPTS[3], LONG):
                    if event.token_id is not None:
                        break
            else:
                async with contextlib.aclosing(ae.generate(PROMPTS[3], LONG)) as stream:
                    await anext(stream)
            await _settle(ae)
            assert ae.stats().steps < 100  # aborted, not run to its 200 tokens
            _assert_all_returned(engine)

    _run(main())


def test_cancelled_consumers_abort_their_requests(tiny: Tiny) -> None:
    engine = _engine(tiny, step_delay=0.002)

    async def main() -> None:
        with AsyncEngine(engine) as ae:
            started = [asyncio.Event() for _ in range(3)]

            async def consume(i: int) -> None:  # an HTTP handler whose client hangs up
                async for _ in ae.generate(PROMPTS[i], LONG):
                    started[i].set()

            tasks = [asyncio.create_task(consume(i)) for i in range(3)]
            await asyncio.gather(*(s.wait() for s in started))
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(r, asyncio.CancelledError) for r in results)
            await _settle(ae)
            assert ae.stats().steps < 100
            _assert_all_returned(engine)

    _run(main())


def test_submission_errors_reach_the_caller_as_raised(tiny: Tiny) -> None:
    engine = _engine(tiny, step_delay=0.005, max_waiting=1, max_num_seqs=1)

    async def main() -> None:
        with AsyncEngine(engine) as ae:
            running = ae.generate(PROMPTS[0], LONG, request_id="a")
            await anext(running)  # "a" holds the only running slot
            waiting = asyncio.create_task(_collect(ae, PROMPTS[1], GREEDY))
            await asyncio.sleep(0.05)  # its Submit is in, and it waits: the queue is full now
            with pytest.raises(EngineBusy, match="already waiting, the limit is 1"):
                await anext(ae.generate(PROMPTS[2], GREEDY))
            with pytest.raises(ValueError, match="leaves no room to generate"):
                await anext(ae.generate([1] * 300, GREEDY))
            with pytest.raises(ValueError, match="'a' is already in use"):
                await anext(ae.generate(PROMPTS[2], GREEDY, request_id="a"))
            await running.aclose()
            assert (await waiting)[-1].finish_reason == "length"  # it runs once "a" is gone
        assert ae.num_live() == 0

    _run(main())


def test_close_ends_live_streams_and_joins_the_thread(tiny: Tiny) -> None:
    engine = _engine(tiny, step_delay=0.002)

    async def main() -> None:
        ae = AsyncEngine(engine).start()
        streams = [ae.generate(p, LONG) for p in PROMPTS[:4]]
        firsts = [await anext(s) for s in streams]
        await asyncio.to_thread(ae.close)
        rests = [[e async for e in s] for s in streams]
        for first, rest in zip(firsts, rests, strict=True):
            events = [first, *rest]
            assert events[-1].finished and events[-1].finish_reason == "abort"
            assert sum(e.finished for e in events) == 1
        assert not ae._thread.is_alive() and not ae.is_running and ae.num_live() == 0
        ae.close()  # idempotent
        with pytest.raises(RuntimeError, match="closed"):
            await anext(ae.generate(PROMPTS[0], GREEDY))
        _assert_all_returned(engine)

    _run(main())


def test_an_idle_engine_thread_sleeps(tiny: Tiny) -> None:
    async def main() -> None:
        with AsyncEngine(_engine(tiny)) as ae:
            await asyncio.sleep(0.2)
            assert ae.stats().idle and ae.stats().iterations <= 2
            await _collect(ae, PROMPTS[0], GREEDY)
            await _settle(ae)
            before = ae.stats().iterations
            await asyncio.sleep(0.2)
            assert ae.stats().iterations == before

    _run(main())


def test_a_failed_step_ends_its_requests_and_the_engine_serves_on(tiny: Tiny) -> None:
    engine = _engine(tiny)
    run = engine.runner.run
    engine.runner.run = lambda batch: 1 / 0  # type: ignore[assignment, method-assign]

    async def main() -> None:
        with AsyncEngine(engine) as ae:
            events = await _collect(ae, PROMPTS[0], GREEDY)
            assert isinstance(events[-1], ErrorEvent) and events[-1].finish_reason == "error"
            assert "ZeroDivisionError" in events[-1].error
            await _settle(ae)
            _assert_all_returned(engine)
            engine.runner.run = run  # type: ignore[method-assign]  # (idle: the thread is not in it)
            assert (await _collect(ae, PROMPTS[0], GREEDY))[-1].finish_reason == "length"

    _run(main())


def test_a_crashed_loop_fails_every_stream_and_is_logged(
    tiny: Tiny, caplog: pytest.LogCaptureFixture
) -> None:
    engine = _engine(tiny)
    step, calls = engine.step, []

    def flaky() -> list[TokenEvent]:
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("scheduler bug")
        return step()

    engine.step = flaky  # type: ignore[method-assign]

    async def main() -> None:
        with AsyncEngine(engine) as ae:
            streams = await asyncio.gather(*(_collect(ae, p, LONG) for p in PROMPTS[:3]))
            for events in streams:
                assert isinstance(events[-1], ErrorEvent) and "scheduler bug" in events[-1].error
            assert not ae.is_running and ae.num_live() == 0
            with pytest.raises(EngineDead):
                await anext(ae.generate(PROMPTS[0], GREEDY))

    with caplog.at_level(logging.ERROR, logger="strata.engine.async_engine"):
        _run(main())
    assert any("engine loop crashed" in r.message for r in caplog.records)
