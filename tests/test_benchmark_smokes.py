"""The GPU benchmark scripts' own smoke runs (`--smoke`: tiny shapes in Triton's interpreter, every
candidate checked against the reference, nothing timed), so a script that no longer runs is found
here rather than on the GPU machine, where device time is scarce."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.parametrize("script", ["gpu_kernels.py", "gpu_matvec_graph.py", "gpu_q4k_rows.py"])
def test_benchmark_smoke_run(script: str):
    # Not imported here at module level: importing triton before a kernel test module sets
    # TRITON_INTERPRET would leave that module's kernels uninterpretable when this file runs first.
    pytest.importorskip("triton")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--smoke"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "checks failed: 0" in done.stdout or "0 failed" in done.stdout


def test_prefill_host_runs_on_the_cpu(tmp_path: Path):
    from strata.synth.layouts import load_layout
    from strata.synth.writer import write_layout

    model = tmp_path / "m.gguf"
    write_layout(model, load_layout("qwen2.5-0.5b-tiny"), seed=0)
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "prefill_host.py"), str(model), "--device", "cpu", "-p", "24",
         "--repeats", "2"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "prefill of 24: median" in done.stdout and "function calls" in done.stdout


def test_decode_host_runs_on_the_cpu(tmp_path: Path):
    from strata.synth.layouts import load_layout
    from strata.synth.writer import write_layout

    model = tmp_path / "m.gguf"
    write_layout(model, load_layout("qwen2.5-0.5b-tiny"), seed=0)
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "decode_host.py"), str(model), "--device", "cpu", "-n", "4"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "| m.gguf | 1 |" in done.stdout and "function calls" in done.stdout
