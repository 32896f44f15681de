"""What the captured graphs cost an engine's build: `python benchmarks/engine_build.py MODEL.gguf ...`.

For each model: the seconds an `LLMEngine` takes to build (KV pool, decode graphs and prefill graphs
captured) and the GPU memory it reserves, with the default prefill graphs and with none (after an
untimed build and prefill that compile the kernels); then a prefill of 512 tokens timed on each engine
(median of 5, ms; the prefix cache off, so every one computes all 512). GPU only.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from strata.bench.runners import drain, first_tokens
from strata.engine.llm import LLM, ModelConfig
from strata.engine.llm_engine import EngineConfig, LLMEngine
from strata.engine.sampler import SamplingParams


def build(llm: LLM, config: EngineConfig) -> tuple[LLMEngine, float, float]:
    torch.cuda.synchronize()
    before, t0 = torch.cuda.memory_reserved(), time.perf_counter()
    engine = LLMEngine(llm.model, llm.tokenizer, config)
    torch.cuda.synchronize()
    return engine, time.perf_counter() - t0, (torch.cuda.memory_reserved() - before) / 2**20


def prefill_ms(engine: LLMEngine, prompt: list[int]) -> float:
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        requests = first_tokens(engine, [prompt], SamplingParams(max_tokens=1, ignore_eos=True))
        times.append((time.perf_counter() - t0) * 1e3)
        drain(engine, requests)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    args = p.parse_args()
    print("| model | prefill graphs | build s | reserved MiB | prefill of 512, ms |")
    print("|---|---|---:|---:|---:|")
    for path in args.models:
        llm = LLM(ModelConfig(Path(path), "bfloat16", device="cuda"))
        prompt = [(7 * i) % 1000 + 100 for i in range(512)]
        arms = (("warm-up", ()), ("none", ()), ("default", EngineConfig().prefill_graph_tokens))
        for name, tokens in arms:
            config = EngineConfig(num_blocks=256, enable_prefix_cache=False, prefill_graph_tokens=tokens)
            engine, seconds, mib = build(llm, config)
            ms = prefill_ms(engine, prompt)
            print(f"| {Path(path).name} | {name} | {seconds:.2f} | {mib:.0f} | {ms:.2f} |")
            del engine
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
