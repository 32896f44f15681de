"""`LLMEngine`: requests in, token events out; each `step()` is schedule, run, postprocess."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from strata import env
from strata.engine.block_manager import BlockManager
from strata.engine.cuda_graphs import DEFAULT_BATCH_SIZES
from strata.engine.model_runner import ModelRunner, RunnerOutput, ScheduledBatch
from strata.engine.prefill_graphs import DEFAULT_TOKEN_SIZES, prefill_tokens
from strata.engine.request import FinishReason, Request
from strata.engine.sampler import SamplingParams, max_new_tokens, sample_batch
from strata.engine.scheduler import Scheduler, SchedulerConfig
from strata.engine.sequence import Sequence
from strata.engine.stop import StopChecker
from strata.engine.think_budget import ThinkBudget, ThinkTracker
from strata.models.base import DecoderModel
from strata.prompt.tokenizer import Tokenizer


@dataclass(frozen=True)
class EngineConfig:
    num_blocks: int = 512
    block_size: int = 16
    enable_prefix_cache: bool = True
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cuda_graphs: bool = True  # on a GPU: replay captured decode steps
    graph_batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES  # the batch sizes captured
    # Prefill attention through the paged Triton kernel on the kernel path (else the torch reference
    # over gathered K/V). On since its parity passed compiled on the H200 and `strata bench ab
    # strata:prefill_kernel=0 strata:prefill_kernel=1` measured 0.5B prefill of 2,048 at 1.55x
    # (2026-12-04, benchmarks/RESULTS.md).
    prefill_kernel: bool = True
    # With the prefill kernel on a GPU: token counts at which prefill and mixed steps are captured as
    # CUDA graphs (`strata.engine.prefill_graphs`), () for none. `strata bench ab strata
    # strata:prefill_graphs=1` (H100, 2026-12-06): 0.5B prefill of 2,048 4.27x, of 512 7.1x, 7B of 512
    # 1.43x, the same token ids.
    prefill_graph_tokens: tuple[int, ...] = DEFAULT_TOKEN_SIZES

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError(
                f"num_blocks {self.num_blocks} and block_size {self.block_size} must be positive"
            )


@dataclass(frozen=True)
class TokenEvent:
    """One generated token of one request (or its end), with the text it completes."""

    request_id: str
    token_id: int | None  # None for an event that only finishes the request
    text: str  # new text safe to show: never half a character, never part of a stop string
    finished: bool = False
    finish_reason: FinishReason | None = None
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    cached_tokens: int | None = None  # on the finishing event: prompt tokens served from the prefix cache
    error: str | None = None  # on a finishing event with finish_reason "error"


@dataclass
class _Live:
    """Per-request engine state that is not KV: its sequence, RNG, stop checker and token limit."""

    seq: Sequence
    generator: torch.Generator | None
    stop: StopChecker
    max_tokens: int
    think: ThinkTracker | None = None


class LLMEngine:
    def __init__(self, model: DecoderModel, tokenizer: Tokenizer, config: EngineConfig) -> None:
        self.config, self.tokenizer = config, tokenizer
        self.context_length = model.spec.context_length
        self.blocks = BlockManager(config.num_blocks, config.block_size, config.enable_prefix_cache)
        self.scheduler = Scheduler(config.scheduler, self.blocks)
        # No graph larger than the smallest one that holds the scheduler's whole batch.
        limit = config.scheduler.max_num_seqs
        sizes = sorted(config.graph_batch_sizes)
        cap = next((b for b in sizes if b >= limit), sizes[-1])
        self.runner = ModelRunner(
            model,
            config.num_blocks,
            config.block_size,
            config.cuda_graphs,
            tuple(b for b in sizes if b <= cap),
            config.prefill_kernel,
            prefill_tokens(config.prefill_graph_tokens, config.scheduler.max_num_batched_tokens),
            limit,
        )
        self._live: dict[str, _Live] = {}
        self._aborted: set[str] = set()
        self._ids = itertools.count()

    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        priority: int = 0,
        think: ThinkBudget | None = None,
    ) -> Request:
        """Queue a request; raises EngineBusy when the waiting queue is full, ValueError for bad input.

        `think` caps the turn's reasoning (see `strata.engine.think_budget`)."""
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already in use")
        limit = max_new_tokens(params, len(prompt_ids), self.context_length)
        needed = -(-(len(prompt_ids) + self.config.scheduler.reserve_tokens) // self.config.block_size)
        if needed > self.config.num_blocks:
            raise ValueError(
                f"prompt is {len(prompt_ids):,} tokens and needs {needed} KV blocks of "
                f"{self.config.block_size} tokens; the pool has {self.config.num_blocks}; shorten the prompt "
                "or give the engine more KV blocks"
            )
        request = Request(
            request_id, tuple(prompt_ids), params, priority=priority, arrival_time=time.monotonic()
        )
        # Everything that can fail comes before the scheduler sees the sequence: nothing is left queued.
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        stop = StopChecker.for_params(self.tokenizer, params)
        tracker = ThinkTracker(think) if think is not None else None
        seq = Sequence(request)
        self.scheduler.add(seq)
        self._live[request_id] = _Live(seq, generator, stop, limit, tracker)
        return request

    def abort(self, request_id: str) -> None:
        """Cancel a request; its blocks are freed at the start of the next step."""
        if request_id in self._live:
            self._aborted.add(request_id)

    def has_unfinished(self) -> bool:
        return bool(self._live)

    def step(self) -> list[TokenEvent]:
        events = self._reap_aborted()
        batch = self.scheduler.schedule()
        events += [self._finish(seq.request.request_id, "length") for seq in self.scheduler.exhausted]
        self.scheduler.exhausted.clear()
        if not batch.seqs:
            return events
        steps = self._steps_ahead(batch)
        if steps > 1:
            return events + self._run_ahead(batch, steps)
        try:
            out = self.runner.run(batch)
        except Exception as e:  # a failed step fails its requests, never leaks their blocks
            return events + self._fail(batch.seqs, f"the model step failed: {type(e).__name__}: {e}")
        self.scheduler.finish_step(batch)
        try:
            return events + self._postprocess(batch, out)
        except Exception as e:  # sampling failed (say, logits a penalty drove to inf): fail, don't die
            return events + self._fail(out.seqs, f"sampling failed: {type(e).__name__}: {e}")

    def _steps_ahead(self, batch: ScheduledBatch) -> int:
        """How many decode steps this batch runs before the host reads its tokens (STRATA_DECODE_STEPS):
        1 unless every request takes the plain argmax without a think budget and the runner can run
        it ahead; at most any request's tokens left; and only if the KV blocks for them are there."""
        steps = env.decode_steps()
        if steps == 1 or not batch.is_decode or not self.runner.can_run_ahead(batch):
            return 1
        for seq in batch.seqs:
            state = self._live[seq.request.request_id]
            if state.think is not None or not seq.request.sampling.plain_argmax:
                return 1
            steps = min(steps, state.max_tokens - len(seq.request.output_ids))
        if steps <= 1:
            return 1
        # Blocks granted to an earlier sequence before a later one finds none stay in its table for
        # the steps to come.
        for seq in batch.seqs:
            if not self.blocks.can_append(seq, steps):
                return 1
            self.blocks.append_slots(seq, steps)
        return steps

    def _run_ahead(self, batch: ScheduledBatch, steps: int) -> list[TokenEvent]:
        """Run `steps` decode steps on the device (`ModelRunner.argmax_steps`), then emit their tokens
        step by step as single steps would; a request that ends drops the tokens computed past its end
        (their KV went to its own blocks, freed with it)."""
        try:
            picks = self.runner.argmax_steps(batch, steps)
        except Exception as e:  # as in step(): fail the batch's requests, never leak their blocks
            return self._fail(batch.seqs, f"the model step failed: {type(e).__name__}: {e}")
        self.scheduler.finish_step(batch)
        states = [self._live[seq.request.request_id] for seq in batch.seqs]
        ended = [False] * len(batch.seqs)
        events: list[TokenEvent] = []
        try:
            for j, tokens in enumerate(picks):
                for row, (seq, state) in enumerate(zip(batch.seqs, states, strict=True)):
                    if ended[row]:
                        continue
                    if j:  # step j computed the KV of the token emitted at step j - 1
                        self.blocks.mark_computed(seq, seq.num_computed_tokens + 1)
                    ended[row] = self._emit(seq, state, tokens[row], events)
        except Exception as e:  # as in step(): fail what is left, don't die
            live = tuple(seq for seq, done in zip(batch.seqs, ended, strict=True) if not done)
            return events + self._fail(live, f"decoding failed: {type(e).__name__}: {e}")
        return events

    def _fail(self, seqs: tuple[Sequence, ...], message: str) -> list[TokenEvent]:
        live = [seq.request.request_id for seq in seqs if seq.request.request_id in self._live]
        return [self._finish(request_id, "error", message) for request_id in live]

    def _reap_aborted(self) -> list[TokenEvent]:
        events = [self._finish(request_id, "abort") for request_id in sorted(self._aborted)]
        self._aborted.clear()
        return events

    def _postprocess(self, batch: ScheduledBatch, out: RunnerOutput) -> list[TokenEvent]:
        if not out.seqs:
            return []
        live = [self._live[seq.request.request_id] for seq in out.seqs]
        sampled = sample_batch(
            out.logits,
            [seq.request.sampling for seq in out.seqs],
            [state.generator for state in live],
            [seq.token_ids for seq in out.seqs],
            [seq.num_prompt_tokens for seq in out.seqs],
        )
        events: list[TokenEvent] = []
        for row, (seq, state) in enumerate(zip(out.seqs, live, strict=True)):
            logprob = sampled.logprobs[row] if sampled.logprobs else None
            top = sampled.top_logprobs[row] if sampled.top_logprobs else None
            done = self._emit(seq, state, sampled.token_ids[row], events, logprob, top)
            if not done and state.think is not None and state.think.due():
                state.think.wrapped = True
                for token in state.think.budget.wrap_up_ids:  # the budget is spent: end the think block
                    if self._emit(seq, state, token, events):
                        break
        return events

    def _emit(
        self,
        seq: Sequence,
        state: _Live,
        token: int,
        events: list[TokenEvent],
        logprob: float | None = None,
        top: list[tuple[int, float]] | None = None,
    ) -> bool:
        """Append one token to the sequence and its event to `events`; True when that ends the request."""
        request = seq.request
        seq.append_token(token)
        request.output_ids.append(token)
        result = state.stop.push(token)
        reason: FinishReason | None = "stop" if result.finished else None
        if reason is None and len(request.output_ids) >= state.max_tokens:
            reason = "length"
        text = result.text + (state.stop.flush() if reason == "length" else "")
        if state.think is not None:
            state.think.push(text)
        cached = request.cached_tokens if reason is not None else None
        events.append(
            TokenEvent(request.request_id, token, text, reason is not None, reason, logprob, top, cached)
        )
        if reason is not None:
            self._finish(request.request_id, reason)
        return reason is not None

    def _finish(self, request_id: str, reason: FinishReason, error: str | None = None) -> TokenEvent:
        state = self._live.pop(request_id)
        state.seq.request.finish(reason, error)
        self.scheduler.remove(state.seq)
        cached = state.seq.request.cached_tokens
        text = state.stop.flush() if reason == "length" else ""  # flush is idempotent
        return TokenEvent(request_id, None, text, True, reason, cached_tokens=cached, error=error)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Request]:
        """Run prompts to completion together (tests, offline use)."""
        requests = [self.add_request(p, params) for p in prompts]
        while self.has_unfinished():
            self.step()
        return requests
