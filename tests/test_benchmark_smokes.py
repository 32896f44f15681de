"""The GPU benchmark scripts' own smoke runs (`--smoke`: tiny shapes in Triton's interpreter, every
candidate checked against the reference, nothing timed), so a script that no longer runs is found
here rather than on the GPU machine, where device time is scarce."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.parametrize(
    "script", ["gpu_kernels.py", "gpu_matvec_graph.py", "gpu_q4k_rows.py", "gpu_attention_graph.py"]
)
def test_benchmark_smoke_run(script: str):
    # Not imported here at module level: importing triton before a kernel test module sets
    # TRITON_INTERPRET would leave that module's kernels uninterpretable when this file runs first.
    pytest.importorskip("triton")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--smoke"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "checks failed: 0" in done.stdout or "0 failed" in done.stdout


@pytest.mark.parametrize(
    "script, args, expected",
    [
        ("prefill_host.py", ["-p", "24", "--repeats", "2"], "prefill of 24: median"),
        ("decode_host.py", ["-n", "4"], "| m.gguf | 1 |"),
    ],
)
def test_host_profile_runs_on_the_cpu(tmp_path: Path, script: str, args: list[str], expected: str):
    from strata.synth.layouts import load_layout
    from strata.synth.writer import write_layout

    model = tmp_path / "m.gguf"
    write_layout(model, load_layout("qwen2.5-0.5b-tiny"), seed=0)
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), str(model), "--device", "cpu", *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert expected in done.stdout and "function calls" in done.stdout


def test_latency_floor_chain_runs_on_the_cpu():
    # The chain kernel in the interpreter, its sums checked (the persistent kernel needs a GPU).
    pytest.importorskip("triton")
    script = str(BENCHMARKS / "latency_floor.py")
    args = [sys.executable, script, "--device", "cpu", "--kib", "0,16"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "chain sums checked in the interpreter (2 sizes)" in done.stdout
