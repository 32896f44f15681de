"""Running one measurement in a worker: the `Measurement`, strata's runner, and the runner registry.

Imported only inside a worker process, where `strata` may be another commit's tree: the strata code
used here is the arm's, so it sticks to the engine's long-lived interface (add_request, step).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from .arms import ENV_OPTIONS
from .workload import Workload


@dataclass(frozen=True)
class Measurement:
    prefill_s: float
    decode_s: float  # 0 in prefill mode
    tokens: list[list[int]]  # per sequence: the token sampled after the prompt, then the decoded ones

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Runner(Protocol):
    def run(self, workload: Workload, prompts: list[list[int]]) -> Measurement: ...


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker loads: sent by the harness as the worker's one command-line argument (JSON)."""

    kind: str
    model: str  # an absolute path: the arm's `model=` option, resolved by the harness
    options: dict[str, str]
    threads: int
    device: str = "cpu"
    max_context: int = 0  # the longest depth + prompt + generated tokens the harness will ask for

    @property
    def model_path(self) -> Path:
        return Path(self.model)


class StrataRunner:
    """strata's `LLMEngine`, built as the server builds it; a fresh engine (empty prefix cache) per run."""

    def __init__(self, config: WorkerConfig) -> None:
        import torch

        from strata.engine.llm import LLM, ModelConfig

        torch.set_num_threads(config.threads)
        opts = config.options
        # GPU options are passed only on the GPU, so CPU runs of commits older than them still work.
        self.gpu = config.device == "cuda"
        gpu: dict[str, Any] = {"device": config.device} if self.gpu else {}
        if "tensor_parallel" in opts:  # likewise only when asked for (the harness sets it for N > 1)
            gpu["tensor_parallel"] = int(opts["tensor_parallel"])
        # Read when the layers are built; this worker process builds one model.
        for option, variable in ENV_OPTIONS.items():
            if option in opts:
                os.environ[variable] = opts[option]
        self.llm = LLM(
            ModelConfig(config.model_path, opts.get("dtype", "bfloat16" if self.gpu else "float32"), **gpu)
        )
        self.cuda_graphs = opts.get("cuda_graphs", "1") not in ("0", "false", "no")
        self.prefill_kernel = opts.get("prefill_kernel", "1") not in ("0", "false", "no")
        self.prefill_graphs = opts.get("prefill_graphs", "1") not in ("0", "false", "no")
        self.block_size = int(opts.get("block_size", 16))
        self.max_batched_tokens = int(opts["max_batched_tokens"]) if "max_batched_tokens" in opts else None
        self.prefix_cache = opts.get("prefix_cache", "1") not in ("0", "false", "no")

    def engine(self, workload: Workload) -> Any:
        """A fresh engine sized for the workload, its decode graph captured (each run builds one)."""
        from strata.engine.llm_engine import EngineConfig, LLMEngine
        from strata.engine.scheduler import SchedulerConfig

        # Room for every sequence and its decode reservation, and (by default) the whole batch's
        # prompts in one step, so prefill and decode steps never mix.
        per_seq = -(-(workload.max_context + 16) // self.block_size) + 1
        budget = self.max_batched_tokens or max(2048, workload.batch * workload.prompt_len)
        scheduler = SchedulerConfig(max_num_seqs=max(64, workload.batch), max_num_batched_tokens=budget)
        # Capture only the graph the workload's batch decodes with (a fresh engine captures anew).
        gpu: dict[str, Any] = {}
        if self.gpu:
            from strata.engine.cuda_graphs import DEFAULT_BATCH_SIZES
            from strata.engine.prefill_graphs import DEFAULT_TOKEN_SIZES

            size = next((b for b in DEFAULT_BATCH_SIZES if b >= workload.batch), DEFAULT_BATCH_SIZES[-1])
            # Likewise only the prefill graph that holds the timed prompt step, if one does.
            tokens = workload.batch * (workload.prompt_len - workload.depth)
            prefill = [t for t in DEFAULT_TOKEN_SIZES if t >= tokens][:1] if self.prefill_graphs else []
            gpu = {
                "cuda_graphs": self.cuda_graphs,
                "graph_batch_sizes": (size,),
                "prefill_kernel": self.prefill_kernel,
                "prefill_graph_tokens": tuple(prefill),
            }
        config = EngineConfig(
            num_blocks=per_seq * workload.batch,
            block_size=self.block_size,
            enable_prefix_cache=self.prefix_cache,
            scheduler=scheduler,
            **gpu,
        )
        return LLMEngine(self.llm.model, self.llm.tokenizer, config)

    def run(self, workload: Workload, prompts: list[list[int]]) -> Measurement:
        from strata.engine.sampler import SamplingParams

        engine = self.engine(workload)
        depth = workload.depth
        if depth:
            if depth % self.block_size or not self.prefix_cache:
                raise ValueError(
                    f"depth {depth} is served from strata's prefix cache: it must be a multiple of the "
                    f"block size {self.block_size}, with the prefix cache on"
                )
            warm = [
                engine.add_request(p[:depth], SamplingParams(max_tokens=1, ignore_eos=True)) for p in prompts
            ]
            drain(engine, warm)
        params = SamplingParams(max_tokens=workload.num_generated, ignore_eos=True)
        if self.gpu:
            import torch

            # The engine's build (the KV pool's zeroing, graph capture) may still be running on the GPU:
            # it is not the prefill's time.
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        requests = first_tokens(engine, prompts, params)
        t1 = time.perf_counter()
        drain(engine, requests)
        t2 = time.perf_counter()
        for r in requests:
            if r.cached_tokens != depth:
                raise RuntimeError(
                    f"{r.cached_tokens} prompt tokens came from the prefix cache, expected {depth}"
                )
        return Measurement(
            t1 - t0, t2 - t1 if workload.mode == "decode" else 0.0, [list(r.output_ids) for r in requests]
        )


def first_tokens(engine: Any, prompts: list[list[int]], params: Any) -> list[Any]:
    """The prompts' requests, stepped until each has its first token (or finished): the prefill."""
    requests = [engine.add_request(p, params) for p in prompts]
    while not all(r.output_ids or r.finished for r in requests):
        engine.step()
    return requests


def drain(engine: Any, requests: list[Any]) -> None:
    """Steps the engine until nothing is left; raises if one of `requests` failed."""
    while engine.has_unfinished():
        engine.step()
    for r in requests:
        if r.finish_reason == "error":
            raise RuntimeError(f"strata failed request {r.request_id}: {r.error}")


def build_runner(config: WorkerConfig) -> Runner:
    if config.kind == "strata":
        return StrataRunner(config)
    from . import peers

    if config.kind == "llamacpp":
        return peers.LlamaCppRunner(config)
    if config.kind == "transformers":
        return peers.TransformersRunner(config)
    raise ValueError(f"no runner for arm kind {config.kind!r}")
