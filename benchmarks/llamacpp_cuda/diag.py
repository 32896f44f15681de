"""Which import order lets llama-cpp-python load a model on the GPU: a crash-isolating check.

    PYTHONPATH=/tmp/site:. python3 benchmarks/llamacpp_cuda/diag.py MODEL.gguf

Each case runs in its own interpreter (faulthandler on) and is reported as ok with the generated
token ids, or with its exit status: llama_cpp alone; torch imported first; llama_cpp first, then
torch; and llama_cpp alone in the environment a bench worker inherits. The bench's llamacpp arm
crashed on the GPU machine inside llama_model_load_from_file (2026-12-03/04): first with torch in the
worker (the case "torch first" crashes the same way), then, with torch gone from the worker, still.
"""

from __future__ import annotations

import os
import subprocess
import sys

CASE = """
import faulthandler, sys
faulthandler.enable()
{first}
import llama_cpp
{after}
m = llama_cpp.Llama(sys.argv[1], n_gpu_layers=-1, flash_attn=True, n_ctx=1024, verbose=True, seed=0)
out = m.create_completion([1, 2, 3, 4], max_tokens=8, temperature=0.0)
print("ids ok:", out["choices"][0]["text"][:40].encode())
"""
CASES = {
    "llama_cpp alone": ("", "", {}),
    "torch first": ("import torch; torch.zeros(1, device='cuda')", "", {}),
    "llama_cpp first, then torch": ("", "import torch; torch.zeros(1, device='cuda')", {}),
    # torch's CUDA init sets CUDA_MODULE_LOADING=LAZY in os.environ, which a bench worker inherits
    # from the harness (a torch process) even when it never imports torch itself.
    "CUDA_MODULE_LOADING=LAZY, no torch": ("", "", {"CUDA_MODULE_LOADING": "LAZY"}),
    "CUDA_MODULE_LOADING=EAGER, no torch": ("", "", {"CUDA_MODULE_LOADING": "EAGER"}),
    "fd 1 on fd 2, as the worker": ("import os; os.dup2(2, 1)", "", {}),
}


def main() -> int:
    model = sys.argv[1]
    failed = 0
    print("environment:", {k: v for k, v in os.environ.items() if "CUDA" in k or "NCCL" in k})
    for name, (first, after, env) in CASES.items():
        code = CASE.format(first=first, after=after)
        cmd = [sys.executable, "-c", code, model]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **env})
        ok = proc.returncode == 0
        failed += not ok
        tail = proc.stdout.strip().splitlines()[-1:] if ok else proc.stderr.strip().splitlines()[-12:]
        print(f"== {name}: {'ok' if ok else f'exit status {proc.returncode}'}")
        for line in tail:
            print("   ", line[:200])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
