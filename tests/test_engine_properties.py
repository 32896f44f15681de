"""`LLMEngine` under random traffic on a tiny synthetic model: adds, aborts, steps and failed steps.

Whatever the interleaving, the block manager stays consistent, every request finishes exactly once
with a valid reason, deterministic requests (greedy or seeded) produce what they produce alone, and
at the end every KV block is back. A separate deterministic test checks that preemption and the
prefix cache never change greedy tokens.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings, target
from hypothesis import strategies as st

from strata.engine.llm_engine import EngineConfig, LLMEngine, TokenEvent
from strata.engine.model_runner import RunnerOutput, ScheduledBatch
from strata.engine.request import Request
from strata.engine.sampler import SamplingParams
from strata.engine.scheduler import SchedulerConfig
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.gguf.synth import SynthSpec, write_synthetic
from strata.models import build_model
from strata.models.base import DecoderModel
from strata.prompt.tokenizer import Tokenizer

BLOCK_SIZE = 4
REASONS = {"stop", "length", "abort", "error"}
_rng = random.Random(7)
PREFIXES = [[_rng.randrange(256) for _ in range(40)] for _ in range(3)]  # prompts are cut from these
STOP_CANDIDATES = (8, 21, 22, 29, 117, 137)  # bytes the synthetic model's greedy runs often emit


@dataclass
class Synth:
    """The tiny model, its tokenizer, and memoized reference outputs (each request run alone)."""

    model: DecoderModel
    tokenizer: Tokenizer
    references: dict[tuple[tuple[int, ...], SamplingParams], Request] = field(default_factory=dict)

    def engine(
        self, num_blocks: int, prefix_cache: bool, scheduler: SchedulerConfig | None = None
    ) -> LLMEngine:
        config = EngineConfig(num_blocks, BLOCK_SIZE, prefix_cache, scheduler or SchedulerConfig())
        return LLMEngine(self.model, self.tokenizer, config)

    def reference(self, prompt: list[int], params: SamplingParams) -> Request:
        """The request run alone in a roomy engine with the prefix cache off."""
        key = (tuple(prompt), params)
        if key not in self.references:
            self.references[key] = self.engine(128, prefix_cache=False).generate([prompt], params)[0]
        return self.references[key]


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synth]:
    """The model, built once; one torch thread while it runs (tiny matmuls, and no spinning
    OpenMP threads when other processes share the cores)."""
    path = write_synthetic(tmp_path_factory.mktemp("synth") / "qwen2.gguf", SynthSpec("qwen2"))
    gguf = GGUFFile(path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield Synth(build_model(gguf, ModelSpec.from_gguf(gguf)), Tokenizer.from_gguf(gguf.metadata))
    finally:
        torch.set_num_threads(threads)


def blocks_for(num_tokens: int) -> int:
    return -(-num_tokens // BLOCK_SIZE)


def assert_all_returned(engine: LLMEngine) -> None:
    """Every block free or free-cached, nothing scheduled."""
    engine.blocks.check_invariants()
    assert all(block.ref_count == 0 for block in engine.blocks.blocks)
    assert engine.blocks.num_free_blocks == engine.config.num_blocks
    assert engine.scheduler.num_waiting == 0 and not engine.scheduler.running
    assert not engine.has_unfinished()


# --- random traffic -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    num_blocks: int
    prefix_cache: bool
    max_num_batched_tokens: int
    max_num_seqs: int
    reserve_tokens: int


@dataclass(frozen=True)
class Add:
    prefix: int
    length: int
    tail: tuple[int, ...]  # replaces the prompt's last tokens: prompts diverge inside a block
    max_tokens: int
    kind: str  # "greedy", "seeded" or "random" (unseeded sampling: no output check)
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    priority: int


@dataclass(frozen=True)
class Abort:
    index: int  # into every id ever added, finished ones included, plus one never-used id


@dataclass(frozen=True)
class Step:
    fail: bool = False  # the model step raises (once), so its batch finishes with "error"


CONFIGS = st.builds(
    Config,
    num_blocks=st.integers(8, 24),
    prefix_cache=st.booleans(),
    max_num_batched_tokens=st.sampled_from([8, 16, 64]),
    max_num_seqs=st.sampled_from([2, 4, 64, 64]),
    reserve_tokens=st.sampled_from([0, 0, 4, 16]),
)
ADDS = st.builds(
    Add,
    prefix=st.integers(0, len(PREFIXES) - 1),
    length=st.integers(1, 40),
    tail=st.lists(st.integers(0, 255), max_size=3).map(tuple),
    max_tokens=st.integers(1, 12),
    kind=st.sampled_from(["greedy", "greedy", "seeded", "random"]),
    stop_token_ids=st.lists(st.sampled_from(STOP_CANDIDATES), max_size=2, unique=True).map(tuple),
    ignore_eos=st.booleans(),
    priority=st.integers(0, 1),
)
OPS = st.lists(
    st.one_of(  # one_of picks a branch uniformly: adds and plain steps are the common operations
        *[ADDS] * 8,
        *[st.builds(Abort, index=st.integers(0, 30))] * 2,
        *[st.builds(Step, fail=st.just(False))] * 5,
        st.builds(Step, fail=st.just(True)),
    ),
    min_size=10,
    max_size=40,
)


class FlakyRunner:
    """Stands in for `engine.runner.run`: records every batch and raises when armed."""

    def __init__(self, engine: LLMEngine) -> None:
        self.inner = engine.runner.run
        self.armed = False
        self.failed: list[str] = []  # request ids of the last failed batch

    def __call__(self, batch: ScheduledBatch) -> RunnerOutput:
        ids = [seq.request.request_id for seq in batch.seqs]
        assert len(set(ids)) == len(ids), f"a sequence is scheduled twice in one step: {ids}"
        if self.armed:
            self.armed, self.failed = False, ids
            raise RuntimeError("injected failure")
        return self.inner(batch)


class Traffic:
    """Drives one engine and checks it after every step."""

    def __init__(self, synth: Synth, config: Config) -> None:
        self.synth, self.config = synth, config
        scheduler = SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            reserve_tokens=config.reserve_tokens,
        )
        self.engine = synth.engine(config.num_blocks, config.prefix_cache, scheduler)
        self.runner = FlakyRunner(self.engine)
        self.engine.runner.run = self.runner  # type: ignore[method-assign]
        self.requests: dict[str, Request] = {}
        self.max_tokens: dict[str, int] = {}
        self.events: dict[str, list[TokenEvent]] = defaultdict(list)
        self.pending_aborts: set[str] = set()

    def live(self, request_id: str) -> bool:
        return request_id in self.requests and not self.requests[request_id].finished

    def add(self, op: Add) -> None:
        """Add a request (or check that one too big for the pool, or with a live id, is refused)."""
        prompt = PREFIXES[op.prefix][: op.length]
        prompt[max(0, len(prompt) - len(op.tail)) :] = op.tail[: len(prompt)]
        slots = self.config.num_blocks * BLOCK_SIZE
        max_tokens = op.max_tokens
        if self.config.reserve_tokens:
            # Keep prompt + output + reserve within the pool: a preempted sequence beyond that is never
            # readmitted (see test_preempted_sequence_beyond_the_reserve_is_readmitted).
            max_tokens = min(max_tokens, max(1, slots - self.config.reserve_tokens - len(prompt) + 1))
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0 if op.kind == "greedy" else 0.8,
            seed=len(self.requests) if op.kind == "seeded" else None,
            stop_token_ids=op.stop_token_ids,
            ignore_eos=op.ignore_eos,
        )
        request_id = f"r{len(self.requests)}"
        if blocks_for(len(prompt) + self.config.reserve_tokens) > self.config.num_blocks:
            with pytest.raises(ValueError, match="KV blocks"):
                self.engine.add_request(prompt, params, request_id, op.priority)
            return
        self.requests[request_id] = self.engine.add_request(prompt, params, request_id, op.priority)
        self.max_tokens[request_id] = max_tokens
        live = [rid for rid in self.requests if self.live(rid)]
        with pytest.raises(ValueError, match="already in use"):
            self.engine.add_request([1, 2, 3], params, live[0])

    def abort(self, op: Abort) -> None:
        """Abort a live, finished or unknown id; a live one must end with "abort" at the next step."""
        ids = [*self.requests, "never-added"]
        request_id = ids[op.index % len(ids)]
        if self.live(request_id):
            self.pending_aborts.add(request_id)
        self.engine.abort(request_id)  # harmless for finished and unknown ids

    def step(self, fail: bool = False) -> list[TokenEvent]:
        """One engine step (its model call raising if `fail`), then every per-step check."""
        self.runner.armed, self.runner.failed = fail, []
        events = self.engine.step()
        self.runner.armed = False
        self.engine.blocks.check_invariants()
        assert len(self.engine.scheduler.running) <= self.config.max_num_seqs
        for ev in events:
            request, history = self.requests[ev.request_id], self.events[ev.request_id]
            assert not history or not history[-1].finished, f"{ev} after {ev.request_id} finished"
            history.append(ev)
            if ev.finished:
                assert ev.finish_reason in REASONS and ev.finish_reason == request.finish_reason
                assert request.finished and ev.cached_tokens == request.cached_tokens
            else:
                assert ev.token_id is not None and not request.finished
        queued = {s.request.request_id for s in self.engine.scheduler.running}
        queued |= {s.request.request_id for s in self.engine.scheduler.waiting()}
        assert all(not self.requests[rid].finished for rid in queued), "a finished request is still queued"
        assert queued == {rid for rid in self.requests if self.live(rid)}, "a live request is lost"
        for request_id in self.pending_aborts:
            assert self.requests[request_id].finish_reason == "abort"
            assert self.events[request_id][-1].finish_reason == "abort"
        self.pending_aborts.clear()
        for request_id in self.runner.failed:
            request = self.requests[request_id]
            assert request.finish_reason == "error" and request.error and "injected failure" in request.error
            assert self.events[request_id][-1].error == request.error
        return events

    def drain(self) -> None:
        """Step until nothing is unfinished (a step cap turns a livelock into a failure)."""
        cap = 100 + 4 * sum(len(r.prompt_ids) + self.max_tokens[i] for i, r in self.requests.items())
        for _ in range(cap):
            if not self.engine.has_unfinished():
                break
            self.step()
        stuck = [*self.engine.scheduler.running, *self.engine.scheduler.waiting()]
        assert not self.engine.has_unfinished(), f"still unfinished after {cap} steps: {stuck}"
        assert_all_returned(self.engine)

    def check_results(self) -> None:
        """Per request: one finish, tokens and text as streamed, outputs as when run alone."""
        tokenizer = self.synth.tokenizer
        for request_id, request in self.requests.items():
            events = self.events[request_id]
            assert [e.finished for e in events].count(True) == 1 and events[-1].finished
            assert [e.token_id for e in events if e.token_id is not None] == request.output_ids
            reason, out, limit = request.finish_reason, request.output_ids, self.max_tokens[request_id]
            params = request.sampling
            stops = set(params.stop_token_ids) | (set() if params.ignore_eos else tokenizer.eos_ids)
            assert len(out) <= limit
            assert request.cached_tokens % BLOCK_SIZE == 0 and request.cached_tokens < len(request.prompt_ids)
            assert self.config.prefix_cache or request.cached_tokens == 0
            assert not stops & set(out[:-1]), f"{request_id} generated past a stop token: {out}"
            if reason == "stop":
                assert out and out[-1] in stops
            elif out and reason == "length":
                assert out[-1] not in stops
            if reason == "stop" or (reason == "length" and len(out) == limit):
                text = "".join(e.text for e in events)
                assert text == tokenizer.decode(out[:-1] if reason == "stop" else out)
            if params.greedy or params.seed is not None:
                expected = self.synth.reference(list(request.prompt_ids), params)
                if reason == "stop" or (reason == "length" and len(out) == limit):
                    assert (out, reason) == (expected.output_ids, expected.finish_reason), request_id
                else:  # aborted, failed or outgrew the pool: what it produced is a prefix
                    assert out == expected.output_ids[: len(out)], request_id

    def report(self) -> None:
        """What this example exercised (shown by pytest --hypothesis-show-statistics)."""
        target(float(self.engine.scheduler.num_preemptions), label="preemptions")
        event("preempted" if self.engine.scheduler.num_preemptions else "no preemption")
        for request_id, request in self.requests.items():
            event(f"finished {request.finish_reason}")
            if request.finish_reason == "length" and len(request.output_ids) < self.max_tokens[request_id]:
                event("outgrew the pool")
            if request.cached_tokens:
                event("prefix cache hit")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=CONFIGS, ops=OPS)
def test_random_traffic_keeps_every_invariant(synth: Synth, config: Config, ops: list[object]) -> None:
    """Adds, aborts, steps and failed steps in any order, then a drain: nothing leaks or is lost."""
    traffic = Traffic(synth, config)
    for op in ops:
        if isinstance(op, Add):
            traffic.add(op)
        elif isinstance(op, Abort):
            traffic.abort(op)
        elif isinstance(op, Step):
            traffic.step(op.fail)
    traffic.drain()
    traffic.check_results()
    traffic.report()


# --- deterministic checks -----------------------------------------------------------------------

SHARED_PROMPTS = [PREFIXES[i % 2][: 12 + 2 * i] + [i, 200 + i] for i in range(10)]
GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


@pytest.mark.parametrize("prefix_cache", [True, False], ids=["cache", "no-cache"])
def test_preemption_and_prefix_cache_keep_greedy_tokens(synth: Synth, prefix_cache: bool) -> None:
    """A 16-block pool forces preemption; outputs equal a roomy engine's with the cache off."""
    expected = [r.output_ids for r in synth.engine(512, False).generate(SHARED_PROMPTS, GREEDY)]
    scheduler = SchedulerConfig(max_num_batched_tokens=16, reserve_tokens=4)
    engine = synth.engine(16, prefix_cache, scheduler)
    requests = engine.generate(SHARED_PROMPTS, GREEDY)
    print(f"preemptions {engine.scheduler.num_preemptions}, cached {[r.cached_tokens for r in requests]}")
    assert engine.scheduler.num_preemptions > 0
    assert [r.output_ids for r in requests] == expected
    assert all(r.finish_reason == "length" for r in requests)
    if prefix_cache:
        assert sum(r.cached_tokens for r in requests) > 0
    assert_all_returned(engine)


def test_prefix_cache_alone_keeps_greedy_tokens(synth: Synth) -> None:
    """The same prompts again, served from the cache: same tokens, every full prompt block hit."""
    expected = [r.output_ids for r in synth.engine(512, False).generate(SHARED_PROMPTS, GREEDY)]
    engine = synth.engine(512, True)
    first = engine.generate(SHARED_PROMPTS, GREEDY)
    again = engine.generate(SHARED_PROMPTS, GREEDY)  # every full prompt block is a hit now
    assert engine.scheduler.num_preemptions == 0
    assert [r.output_ids for r in first] == [r.output_ids for r in again] == expected
    assert all(r.cached_tokens == (len(r.prompt_ids) - 1) // BLOCK_SIZE * BLOCK_SIZE for r in again)
    assert_all_returned(engine)


def test_a_prompt_larger_than_the_pool_is_refused(synth: Synth) -> None:
    engine = synth.engine(8, True, SchedulerConfig(reserve_tokens=4))
    engine.add_request(list(range(28)), GREEDY)  # 28 + 4 tokens: exactly the 8 blocks
    with pytest.raises(ValueError, match="needs 9 KV blocks"):
        engine.add_request(list(range(29)), GREEDY)
    assert engine.scheduler.num_waiting == 1


def test_a_sequence_outgrowing_the_pool_ends_with_length(synth: Synth) -> None:
    engine = synth.engine(12, True, SchedulerConfig(reserve_tokens=4))
    request = engine.add_request([1, 2, 3], SamplingParams(max_tokens=100, ignore_eos=True))
    events: list[TokenEvent] = []
    for _ in range(200):
        if not engine.has_unfinished():
            break
        events += engine.step()
        engine.blocks.check_invariants()
    assert request.finish_reason == "length"
    # 48 slots hold 48 tokens' KV; the 49th token is sampled, and computing it needs a 13th block.
    assert len(request.output_ids) == 12 * BLOCK_SIZE + 1 - 3
    assert [e.finished for e in events].count(True) == 1 and events[-1].finish_reason == "length"
    assert_all_returned(engine)


def test_every_finishing_event_carries_cached_tokens(synth: Synth) -> None:
    """A stop/length finish reports the prefix-cache hit too, not only abort/error finishes."""
    engine = synth.engine(64, True)
    engine.generate([PREFIXES[0][:20]], GREEDY)
    request = engine.add_request(PREFIXES[0][:20], GREEDY)
    finishing = []
    while engine.has_unfinished():
        finishing += [e for e in engine.step() if e.finished]
    assert request.cached_tokens == 16
    assert [e.cached_tokens for e in finishing] == [16]


# --- regressions: engine bugs this file found --------------------------------------------------------


def test_preempted_sequence_beyond_the_reserve_is_readmitted(synth: Synth) -> None:
    """Once preempted past pool - reserve, a sequence must still come back when the pool frees up."""
    engine = synth.engine(12, False)  # 48 slots; the default reserve_tokens is 16
    older = engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=30, ignore_eos=True))
    newer = engine.add_request(list(range(10, 38)), SamplingParams(max_tokens=40, ignore_eos=True))
    for _ in range(100):
        engine.step()
    assert engine.scheduler.num_preemptions > 0 and older.finish_reason == "length"
    late = engine.add_request([5, 6], SamplingParams(max_tokens=2))  # queued behind `newer`
    for _ in range(100):
        if not engine.has_unfinished():
            break
        engine.step()
    assert engine.blocks.num_free_blocks == 12
    assert newer.finished and late.finished, f"starving: {list(engine.scheduler.waiting())}"


def test_outgrowing_the_pool_flushes_held_back_text(synth: Synth) -> None:
    """Ending with "length" because the pool is outgrown still releases the held-back text."""
    engine = synth.engine(12, True, SchedulerConfig(reserve_tokens=4))
    # Byte 0xE3 starts a 3-byte character; a run of them leaves the last one held back.
    params = SamplingParams(max_tokens=100, ignore_eos=True, logit_bias={0xE3: 100.0})
    request = engine.add_request([1, 2, 3], params)
    texts = []
    while engine.has_unfinished():
        texts += [e.text for e in engine.step()]
    assert request.finish_reason == "length" and len(request.output_ids) < 100
    assert "".join(texts) == synth.tokenizer.decode(request.output_ids)
