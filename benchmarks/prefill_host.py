"""Where a prefill's wall time goes on the host: `python benchmarks/prefill_host.py MODEL.gguf [-p 512]`.

Times a decode workload's prefill (the first token, as `strata bench` does) a few times with the
bench's engine (CUDA graphs on), then profiles one more prefill alone (its engine built first, outside
the profile) and prints cProfile's top functions by own and by cumulative time: for a prefill that is
slower end to end than its kernels (gpu_engine.py --profile-prefill) say it is. The layout settings
come from the environment (STRATA_Q6K_LAYOUT=...). `--device cpu` runs it on the torch reference path
(tests/test_benchmark_smokes.py checks the script so, on a tiny model).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from pathlib import Path

import torch
from gpu_engine import prompts_for, runner  # benchmarks/ is the script's folder, first on sys.path

from strata.bench.runners import drain, first_tokens
from strata.bench.workload import Workload
from strata.engine.sampler import SamplingParams


def print_profile(prof: cProfile.Profile, order: str, count: int, chars: int) -> None:
    """cProfile's top `count` functions by `order`, blank lines dropped, cut at `chars` characters."""
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats(order).print_stats(count)
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:chars])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("-p", "--prompt", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    run = runner(Path(args.model), args.device, "bfloat16" if args.device == "cuda" else "float32")
    workload = Workload("decode", prompt_len=args.prompt, new_tokens=2)
    prompts = prompts_for(Path(args.model), workload)
    run.run(workload, prompts)
    times = [run.run(workload, prompts).prefill_s * 1e3 for _ in range(args.repeats)]
    shown = ", ".join(f"{t:.2f}" for t in times)
    print(f"prefill of {args.prompt}: median {statistics.median(times):.2f} ms of {shown}")
    # The prefill alone under the profiler: the engine (and its graphs) built first, as the runner does.
    engine = run.engine(workload)
    if args.device == "cuda":
        torch.cuda.synchronize()
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    prof = cProfile.Profile()
    prof.enable()
    t0 = time.perf_counter()
    requests = first_tokens(engine, prompts, params)
    seconds = time.perf_counter() - t0
    prof.disable()
    drain(engine, requests)
    print(f"under cProfile: {seconds * 1e3:.2f} ms prefill")
    for order in ("tottime", "cumulative"):
        print_profile(prof, order, 25, 6000)


if __name__ == "__main__":
    main()
