"""A decode step's wall time against its graph's: `python benchmarks/decode_host.py MODEL.gguf [-b 1]`.

Decodes with the bench's engine (CUDA graphs on) and times each `engine.step()` (median, ms), then
replays the step's captured graph back to back (the GPU's time a step with nothing on the host in
between). What a step takes beyond its graph is the host's (scheduler, inputs, sampling, events) not
hidden behind the GPU: if it is large, overlapping the next step's host work with this step's graph
is the lever, not the kernels. Ends with cProfile's top functions over the timed steps. `--device cpu`
(tests/test_benchmark_smokes.py) times the steps alone: there is no graph on the CPU. Under
STRATA_DECODE_STEPS a step decodes several positions; "step ms" is per position.
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import time
from pathlib import Path

import torch
from gpu_engine import prompts_for, runner  # benchmarks/ is the script's folder, first on sys.path
from prefill_host import print_profile

from strata import env
from strata.bench.runners import drain, first_tokens
from strata.bench.workload import Workload
from strata.engine.sampler import SamplingParams


def graph_ms(engine: object, replays: int) -> float | None:
    """ms a replay of the engine's decode graph takes, back to back; None without one."""
    graphs = engine.runner.graphs  # type: ignore[attr-defined]
    if graphs is None:
        return None
    graph, _ = next(iter(graphs.graphs.values()))  # the bench's engine captures its batch's size only
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / replays


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("-b", "--batch", type=int, default=1)
    p.add_argument("-n", "--steps", type=int, default=64)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    run = runner(Path(args.model), args.device, "bfloat16" if args.device == "cuda" else "float32")
    # Room for every step's tokens: with STRATA_DECODE_STEPS=K a step emits up to K tokens a sequence.
    ahead = env.decode_steps()
    workload = Workload("decode", prompt_len=128, new_tokens=(2 * args.steps + 8) * ahead, batch=args.batch)
    prompts = prompts_for(Path(args.model), workload)
    engine = run.engine(workload)
    params = SamplingParams(max_tokens=workload.new_tokens, ignore_eos=True)
    requests = first_tokens(engine, prompts, params)
    for _ in range(4):  # warm
        engine.step()
    steps = []  # ms per position decoded (a step that runs ahead decodes several)
    prof = cProfile.Profile()
    for i in range(2 * args.steps):
        if i == args.steps:
            prof.enable()  # the second half under the profiler, the first half timed alone
        t0 = time.perf_counter()
        events = engine.step()
        positions = sum(e.token_id is not None for e in events) / args.batch
        steps.append((time.perf_counter() - t0) * 1e3 / max(positions, 1))
    prof.disable()
    drain(engine, requests)
    step = statistics.median(steps[: args.steps])
    graph = graph_ms(engine, 200) if args.device == "cuda" else None
    print("| model | batch | step ms | graph ms | beyond the graph ms | tok/s |")
    print("|---|---:|---:|---:|---:|---:|")
    shown = "- | -" if graph is None else f"{graph:.3f} | {step - graph:.3f}"
    name = Path(args.model).name
    print(f"| {name} | {args.batch} | {step:.3f} | {shown} | {args.batch * 1e3 / step:,.0f} |")
    print_profile(prof, "tottime", 20, 5000)


if __name__ == "__main__":
    main()
