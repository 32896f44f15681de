"""What one engine step costs besides the model: scheduling, bookkeeping, sampling, stop checks, events.

    python benchmarks/engine_overhead.py [--seqs 64] [--steps 500] [--warmup 50] [--block-size 16]
        [--vocab 1024 151936] [--temperature 0.8 --top-p 0.9] [--logits random|zero] [--no-prefix-cache]

The model runner is replaced by a stub that returns precomputed logits of the right shape for the
sequences that are due (`RunnerOutput(seqs, logits)`), so a step is exactly `LLMEngine.step` minus the
forward pass. `--seqs` requests are added and prefilled, then `--warmup` decode steps run untimed and
`--steps` decode steps are timed with `time.perf_counter_ns`; no sequence finishes meanwhile (EOS is
ignored, max_tokens is out of reach), so every timed step decodes all of them. Phases are timed by
wrapping the engine's own calls:

- schedule: `Scheduler.schedule` (admission, block growth, batch assembly)
- finish_step: `Scheduler.finish_step` (mark tokens computed, hash full blocks for the prefix cache)
- sampling: `sample_batch` on the (seqs, vocab) logits
- stop+events: the rest of `_postprocess`: appending tokens, stop checking and detokenizing, events
- postprocess: sampling + stop+events
- engine total: the whole `step()` minus the stub runner's own time (which is reported too)

The table gives the median and 90th percentile per step, in microseconds, one row per vocabulary
size (sampling cost scales with it). Token ids are decoded with the default model's tokenizer (its
vocabulary is 151,936), so stop checking sees real token bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import platform
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import torch

import strata.engine.llm_engine as llm_engine
from strata.engine.llm_engine import EngineConfig, LLMEngine
from strata.engine.model_runner import ModelRunner, RunnerOutput, ScheduledBatch
from strata.engine.sampler import SamplingParams
from strata.engine.scheduler import SchedulerConfig
from strata.gguf.reader import GGUFFile
from strata.layers.placement import Placement
from strata.model_store import DEFAULT_MODEL, resolve_model
from strata.models.base import DecoderModel
from strata.prompt.tokenizer import Tokenizer

PHASES = ("schedule", "finish_step", "sampling", "stop+events", "postprocess", "runner stub", "engine total")


class StubRunner:
    """Returns logits for the due sequences from a precomputed (rows, vocab) pool, cycling the rows."""

    def __init__(self, max_seqs: int, vocab: int, kind: str, seed: int = 0) -> None:
        rows = max_seqs + 17  # windows start at different rows each step, so greedy tokens vary
        if kind == "zero":
            self.pool = torch.zeros(rows, vocab)
        else:
            self.pool = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))
        self.offset = 0

    def run(self, batch: ScheduledBatch) -> RunnerOutput:
        due = tuple(
            seq
            for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
            if seq.num_computed_tokens + n == seq.num_tokens
        )
        self.offset = (self.offset + 1) % (self.pool.shape[0] - len(due) + 1)
        return RunnerOutput(due, self.pool[self.offset : self.offset + len(due)])


@dataclass
class PhaseClock:
    """Nanoseconds spent in each wrapped call during the current step."""

    ns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))

    def wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns[phase] += time.perf_counter_ns() - start

        return timed

    def reset(self) -> None:
        self.ns = dict.fromkeys(PHASES, 0)


def stub_model(context_length: int) -> DecoderModel:
    """Just what `LLMEngine` and `ModelRunner` read at construction (a one-slot-wide KV cache)."""
    spec = SimpleNamespace(context_length=context_length, num_layers=1, num_kv_heads=1, head_dim=1)
    place = Placement()  # the CPU reference path: no kernels, no CUDA graphs
    return cast(
        DecoderModel, SimpleNamespace(spec=spec, dtype=torch.float32, device=place.device, place=place)
    )


def run_one(args: argparse.Namespace, tokenizer: Tokenizer, vocab: int) -> dict[str, list[float]]:
    """Per-step microseconds of every phase over the timed steps for one vocabulary size."""
    max_tokens = args.warmup + args.steps + 8
    per_seq = -(-(args.prompt_len + max_tokens + 16) // args.block_size)
    config = EngineConfig(
        num_blocks=args.seqs * per_seq + 8,
        block_size=args.block_size,
        enable_prefix_cache=not args.no_prefix_cache,
        scheduler=SchedulerConfig(max_num_seqs=args.seqs, max_num_batched_tokens=max(2048, args.seqs)),
    )
    engine = LLMEngine(stub_model(args.prompt_len + max_tokens + 1), tokenizer, config)
    stub = StubRunner(args.seqs, vocab, args.logits)
    engine.runner = cast(ModelRunner, stub)
    params = SamplingParams(
        max_tokens=max_tokens, temperature=args.temperature, top_p=args.top_p, ignore_eos=True
    )
    rng = random.Random(0)
    for i in range(args.seqs):
        prompt = [rng.randrange(min(vocab, 1024)) for _ in range(args.prompt_len)]
        engine.add_request(prompt, params if params.greedy else dataclasses.replace(params, seed=i))

    clock = PhaseClock()
    engine.scheduler.schedule = clock.wrap("schedule", engine.scheduler.schedule)  # type: ignore[method-assign]
    engine.scheduler.finish_step = clock.wrap("finish_step", engine.scheduler.finish_step)  # type: ignore[method-assign]
    stub.run = clock.wrap("runner stub", stub.run)  # type: ignore[method-assign]
    engine._postprocess = clock.wrap("postprocess", engine._postprocess)  # type: ignore[method-assign]
    original_sample_batch = llm_engine.sample_batch
    llm_engine.sample_batch = clock.wrap("sampling", original_sample_batch)  # type: ignore[assignment]
    samples: dict[str, list[float]] = {phase: [] for phase in PHASES}
    try:
        while engine.scheduler.num_waiting or any(
            s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running
        ):
            engine.step()  # prefill
        for _ in range(args.warmup):
            engine.step()
        gc.collect()
        for _ in range(args.steps):
            clock.reset()
            start = time.perf_counter_ns()
            events = engine.step()
            total = time.perf_counter_ns() - start
            assert len(events) == args.seqs and not any(e.finished for e in events), "a sequence finished"
            ns = clock.ns
            ns["stop+events"] = ns["postprocess"] - ns["sampling"]
            ns["engine total"] = total - ns["runner stub"]
            for phase in PHASES:
                samples[phase].append(ns[phase] / 1000)
    finally:
        llm_engine.sample_batch = original_sample_batch
    assert len(engine.scheduler.running) == args.seqs and engine.scheduler.num_preemptions == 0
    return samples


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seqs", type=int, default=64, help="running sequences (all decoding)")
    parser.add_argument("--steps", type=int, default=500, help="timed decode steps")
    parser.add_argument("--warmup", type=int, default=50, help="untimed decode steps first")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--vocab", type=int, nargs="+", default=[1024, 151_936])
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--logits", choices=["random", "zero"], default="random")
    parser.add_argument("--no-prefix-cache", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="whose tokenizer decodes the tokens")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    tokenizer = Tokenizer.from_gguf(GGUFFile(resolve_model(args.model, progress=False)).metadata)
    sampling = "greedy" if args.temperature == 0 else f"T={args.temperature} top_p={args.top_p}"
    print(
        f"engine overhead per decode step: {args.seqs} sequences, block size {args.block_size}, "
        f"{sampling}, {args.logits} logits, prefix cache {'off' if args.no_prefix_cache else 'on'}, "
        f"{args.steps} timed steps after {args.warmup}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, Python {platform.python_version()}"
    )
    print("µs per step, median / p90\n")
    print("| seqs | vocab | " + " | ".join(PHASES) + " |")
    print("|---:|---:|" + "---:|" * len(PHASES))
    for vocab in args.vocab:
        samples = run_one(args, tokenizer, vocab)
        cells = [f"{statistics.median(samples[p]):,.0f} / {p90(samples[p]):,.0f}" for p in PHASES]
        print(f"| {args.seqs} | {vocab:,} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
