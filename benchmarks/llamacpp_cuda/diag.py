"""Which setting lets llama-cpp-python load a model on the GPU: a crash-isolating check.

    PYTHONPATH=/tmp/site:. python3 benchmarks/llamacpp_cuda/diag.py MODEL.gguf [--gdb]

Each case runs in its own interpreter (faulthandler on) and is reported as ok with the generated
text, or with its exit status: llama_cpp alone; torch imported first; llama_cpp first, then torch;
llama_cpp in the environment a bench worker inherits; the worker's own Llama arguments; and the bench
worker itself (`python -m strata.bench.worker`, one decode request). `--gdb` reruns each failing case
under cuda-gdb (the GPU image has no gdb; cuda-gdb debugs host code too) and prints the C backtrace.
The bench's llamacpp arm crashed on the GPU machine inside llama_model_load_from_file (2026-12-03/04):
first with torch in the worker (the case "torch first" crashes the same way), then, with torch gone
from the worker, still.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

CASE = """
import faulthandler, sys
faulthandler.enable()
{first}
import llama_cpp
{after}
m = llama_cpp.Llama(sys.argv[1], n_gpu_layers=-1, flash_attn=True, verbose=True, seed=0, {kwargs})
out = m.create_completion([1, 2, 3, 4], max_tokens=8, temperature=0.0)
print("ids ok:", out["choices"][0]["text"][:40].encode())
"""
# What peers.LlamaCppRunner passes on a GPU for `bench --mode decode -p 128 -n 32`.
WORKER_KWARGS = "n_ctx=161, n_batch=512, n_ubatch=512, n_threads={t}, n_threads_batch={t}".format(
    t=os.cpu_count() or 1
)
CASES = {
    "llama_cpp alone": ("", "", {}, "n_ctx=1024"),
    "torch first": ("import torch; torch.zeros(1, device='cuda')", "", {}, "n_ctx=1024"),
    "llama_cpp first, then torch": ("", "import torch; torch.zeros(1, device='cuda')", {}, "n_ctx=1024"),
    # torch's CUDA init sets CUDA_MODULE_LOADING=LAZY in os.environ, which a bench worker inherits
    # from the harness (a torch process) even when it never imports torch itself.
    "CUDA_MODULE_LOADING=LAZY, no torch": ("", "", {"CUDA_MODULE_LOADING": "LAZY"}, "n_ctx=1024"),
    "fd 1 on fd 2, as the worker": ("import os; os.dup2(2, 1)", "", {}, "n_ctx=1024"),
    "the worker's Llama arguments": ("", "", {}, WORKER_KWARGS),
    "the worker's imports first": ("import strata.bench.runners, strata.bench.peers", "", {}, "n_ctx=1024"),
    # Whether one libstdc++ for all (the system's, first in the global scope) cures the case above.
    "numpy first, the system libstdc++ preloaded": (
        "import numpy",
        "",
        {"LD_PRELOAD": "/lib/x86_64-linux-gnu/libstdc++.so.6"},
        "n_ctx=1024",
    ),
}


def worker_command(model: str) -> tuple[list[str], str]:
    """The bench worker, started as ArmProcess starts it, and its stdin: one decode run, then exit."""
    threads = os.cpu_count() or 1
    config = {"kind": "llamacpp", "model": os.path.abspath(model), "options": {}, "threads": threads,
              "device": "cuda", "max_context": 161}  # fmt: skip
    workload = {"mode": "decode", "prompt_len": 128, "new_tokens": 32, "depth": 0, "batch": 1, "seed": 0}
    run = {"op": "run", "workload": workload, "prompts": [list(range(100, 228))]}
    stdin = json.dumps(run) + "\n" + json.dumps({"op": "exit"}) + "\n"
    return [sys.executable, "-m", "strata.bench.worker", json.dumps(config)], stdin


def report(name: str, proc: subprocess.CompletedProcess[str], ok: bool) -> None:
    print(f"== {name}: {'ok' if ok else f'exit status {proc.returncode}'}")
    out = proc.stdout.strip().splitlines()
    tail = out[-1:] if ok else out[-2:] + proc.stderr.strip().splitlines()[-14:]
    for line in tail:
        print("   ", line[:220])


def backtrace(name: str, cmd: list[str], stdin: str, env: dict[str, str]) -> None:
    gdb = shutil.which("cuda-gdb") or "/usr/local/cuda/bin/cuda-gdb"
    args = [gdb, "-batch", "-ex", "set pagination off", "-ex", "run", "-ex", "bt 40", "--args", *cmd]
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=600, env=env)
    lines = proc.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if "signal SIG" in line), max(0, len(lines) - 50))
    print(f"-- cuda-gdb backtrace of '{name}':")
    for line in lines[start : start + 50]:
        print("   ", line[:220])


def main() -> int:
    model, use_gdb = sys.argv[1], "--gdb" in sys.argv[2:]
    failed = 0
    shown = {k: v for k, v in os.environ.items() if "CUDA" in k or "NCCL" in k or k == "PYTHONPATH"}
    print("environment:", shown)
    runs = {name: ([sys.executable, "-c", CASE.format(first=a, after=b, kwargs=kw), model], "", env)
            for name, (a, b, env, kw) in CASES.items()}  # fmt: skip
    cmd, stdin = worker_command(model)
    runs["the bench worker (python -m strata.bench.worker)"] = (cmd, stdin, {})
    for name, (cmd, stdin, extra) in runs.items():
        env = {**os.environ, **extra}
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300, env=env)
        ok = proc.returncode == 0 and "error" not in proc.stdout
        failed += not ok
        report(name, proc, ok)
        if not ok and use_gdb:
            backtrace(name, cmd, stdin, env)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
