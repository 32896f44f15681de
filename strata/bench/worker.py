"""One arm's worker process: load the model once, then answer measurement requests, one JSON line each.

    python -m _strata_bench.worker '<WorkerConfig as JSON>'

Replies go to the process's original stdout; everything else the process prints (progress bars, C
libraries writing to fd 1) is sent to stderr, so the protocol channel carries only JSON.

    -> {"ready": true, "load_s": ..., "strata_file": ..., "torch_threads": ...}
    <- {"op": "run", "workload": {...}, "prompts": [[...], ...]}
    -> {"prefill_s": ..., "decode_s": ..., "tokens": [[...], ...], "cpu_s": ...}   (or {"error": ...})
    <- {"op": "exit"}   (or end of input)
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import time
import traceback
from typing import IO, TYPE_CHECKING, Any

# Nothing here loads a C++ library before a llamacpp worker has loaded llama_cpp (see _load_peer_first).
if TYPE_CHECKING:
    from .runners import WorkerConfig


def _protocol_channel() -> IO[str]:
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # fd 1 now writes to stderr, for C code too
    sys.stdout = sys.stderr
    return channel


def _send(channel: IO[str], message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def _error(e: Exception) -> dict[str, Any]:
    """A ValueError is a bad request and its message says why; anything else is a bug: send the trace."""
    if isinstance(e, ValueError):
        return {"error": str(e)}
    return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}


def _ready_info(config: WorkerConfig, load_s: float) -> dict[str, Any]:
    info: dict[str, Any] = {"ready": True, "load_s": load_s}
    if "torch" in sys.modules:  # a llamacpp worker never loads torch (see peers)
        info["torch_threads"] = sys.modules["torch"].get_num_threads()
    if config.kind == "strata":
        import strata

        info["strata_file"] = strata.__file__
    return info


def _load_peer_first(kind: str) -> None:
    """llama.cpp's CUDA libraries as built on the GPU machine carry libstdc++ code of their own (its
    symbols exported from libggml-cuda.so); loaded after a C++ library that the process already holds
    (numpy's, torch's), llama_model_load_from_file crashed in print_info, inside libggml-cuda's copy
    of std::ostream (a cuda-gdb backtrace, benchmarks/llamacpp_cuda/diag.py, 2026-12-04). Loaded
    first, as in a plain `import llama_cpp`, it runs. So a llamacpp worker imports it before numpy."""
    if kind == "llamacpp":
        with contextlib.suppress(ImportError):  # LlamaCppRunner reports it, with the fix
            import llama_cpp  # noqa: F401


def main(argv: list[str]) -> int:
    channel = _protocol_channel()
    # A crash inside a peer's C library then leaves the Python stack in the arm's log.
    faulthandler.enable()
    try:
        fields = json.loads(argv[0])
        _load_peer_first(fields.get("kind", ""))
        from .runners import WorkerConfig, build_runner
        from .workload import Workload

        config = WorkerConfig(**fields)
        t0 = time.perf_counter()
        runner = build_runner(config)
        _send(channel, _ready_info(config, time.perf_counter() - t0))
    except Exception as e:
        _send(channel, _error(e))
        return 1
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "exit":
            break
        try:
            cpu0 = time.process_time()
            result = runner.run(Workload.from_json(request["workload"]), request["prompts"])
            # CPU seconds against wall seconds shows when other processes took the cores mid-run.
            _send(channel, result.to_json() | {"cpu_s": time.process_time() - cpu0})
        except Exception as e:
            _send(channel, _error(e))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
