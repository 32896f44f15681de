"""`strata bench`: the statistics on fixed numbers, the gate, and the harness end to end on tiny
synthetic models (workers are real subprocesses). Speed is never asserted, only structure and gates."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from strata.bench import stats
from strata.bench.ab import schedule
from strata.bench.arms import ArmSpec
from strata.bench.gate import agreement, gate
from strata.bench.workload import Workload, make_prompts, plain_token_ids
from strata.cli import main
from strata.gguf.synth import SynthSpec, write_synthetic

ROOT = Path(__file__).resolve().parents[1]
FAST = ["-p", "12", "-n", "6", "--threads", "1", "--settle", "0", "--seed", "3"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("bench")
    return (
        write_synthetic(folder / "tiny-seed0.gguf", SynthSpec("qwen2")),
        write_synthetic(folder / "tiny-seed1.gguf", SynthSpec("qwen2", seed=1)),
    )


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_HOME", str(tmp_path / "home"))  # the model-hash cache lands here


def _read(out: Path, name: str) -> Any:
    return json.loads((out / name).read_text())


def test_pair_ratios_median_min_max() -> None:
    ratios = stats.pair_ratios([10.0, 20.0, 40.0, 8.0], [11.0, 18.0, 48.0, 8.0])
    assert ratios == pytest.approx([1.1, 0.9, 1.2, 1.0])
    assert stats.ratio_summary(ratios) == pytest.approx({"median": 1.05, "min": 0.9, "max": 1.2})
    with pytest.raises(ValueError, match="equal"):
        stats.pair_ratios([1.0], [1.0, 2.0])


def test_drift_fit_recovers_a_planted_drift_and_arm_effect() -> None:
    order = schedule(4, "abba")
    assert [arm for _, arm in order] == ["A", "B", "B", "A", "A", "B", "B", "A"]
    index = list(range(len(order)))
    is_b = [arm == "B" for _, arm in order]
    values = [100.0 * 1.02**i * (0.8 if b else 1.0) for i, b in zip(index, is_b, strict=True)]
    fit = stats.drift_fit(index, is_b, values)
    assert fit is not None
    assert fit.arm_ratio == pytest.approx(0.8)
    assert fit.drift_per_run == pytest.approx(0.02)
    assert fit.log_intercept == pytest.approx(math.log(100.0))
    assert max(abs(r) for r in fit.log_residuals) < 1e-9 and len(fit.log_residuals) == 8
    # The naive pair ratios are biased by the drift in every pair; the fit is not.
    naive = stats.pair_ratios(
        [v for v, b in zip(values, is_b, strict=True) if not b],
        [v for v, b in zip(values, is_b, strict=True) if b],
    )
    assert naive != pytest.approx([0.8] * 4)
    assert stats.drift_fit([0, 1], [False, True], [1.0, 2.0]) is None  # too few runs to separate


def test_arm_specs() -> None:
    spec = ArmSpec.parse("strata@HEAD~1:threads=1,dtype=bfloat16")
    assert (spec.kind, spec.rev, spec.options) == ("strata", "HEAD~1", {"threads": "1", "dtype": "bfloat16"})
    assert str(spec) == "strata@HEAD~1:threads=1,dtype=bfloat16"
    assert ArmSpec.parse("strata").arithmetic == ArmSpec.parse("strata@abc:threads=2").arithmetic
    assert ArmSpec.parse("strata").arithmetic != ArmSpec.parse("llamacpp").arithmetic
    with pytest.raises(ValueError, match="unknown option warp"):
        ArmSpec.parse("strata:warp=9")
    with pytest.raises(ValueError, match="only strata arms"):
        ArmSpec.parse("llamacpp@HEAD")
    with pytest.raises(ValueError, match="unknown"):
        ArmSpec.parse("vllm")


def test_prompts_are_seeded_and_plain() -> None:
    w = Workload(prompt_len=5, depth=3, batch=2, seed=7)
    vocab = plain_token_ids([1, 3, 1, 1, 4, 1])
    assert vocab == [0, 2, 3, 5]
    prompts = make_prompts(w, vocab)
    assert prompts == make_prompts(w, vocab) and len(prompts) == 2
    assert all(len(p) == 8 and set(p) <= set(vocab) for p in prompts)
    assert prompts != make_prompts(Workload(prompt_len=5, depth=3, batch=2, seed=8), vocab)


def test_gate_modes_and_agreement() -> None:
    def run(arm: str, index: int, tokens: list[list[int]]) -> dict[str, Any]:
        return {"arm": arm, "index": index, "tokens": tokens}

    same = [run("A", 0, [[1, 2, 3]]), run("B", 1, [[1, 2, 3]]), run("A", 2, [[1, 2, 3]])]
    assert gate(same, "identical")["gate"] == "pass"
    other = [run("A", 0, [[1, 2, 3]]), run("B", 1, [[1, 9, 3]]), run("B", 2, [[1, 9, 3]])]
    result = gate(other, "identical")
    assert result["gate"] == "invalid"
    assert result["first_difference"] | {} == {
        "run": 1, "arm": "B", "reference_run": 0, "sequence": 0, "position": 1, "expected": 2, "got": 9
    }  # fmt: skip
    peer = gate(other, "self")  # each arm repeats itself: a peer passes, and the agreement is reported
    assert peer["gate"] == "pass" and peer["agreement"] == {"common_prefix": [1], "equal_fraction": 2 / 3}
    flaky = other + [run("B", 3, [[1, 9, 4]])]
    assert gate(flaky, "self")["first_difference"]["run"] == 3
    assert agreement([[1, 2], [5]], [[1, 2], [6]]) == {"common_prefix": [2, 0], "equal_fraction": 2 / 3}


def test_ab_same_arms_passes_and_records_everything(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["bench", "ab", "strata", "strata", "--model", str(tiny[0]), "--pairs", "2"]
    assert main([*argv, *FAST, "--out", str(out)]) == 0
    runs = _read(out, "runs.json")
    assert [(r["arm"], r["pair"], r["warmup"]) for r in runs] == [
        ("A", None, True), ("B", None, True),  # warm-ups
        ("A", 0, False), ("B", 0, False), ("B", 1, False), ("A", 1, False),  # ABBA
    ]  # fmt: skip
    for r in runs:
        assert r["index"] == runs.index(r) and r["value"] == r["decode_tok_s"] > 0 and r["wall_s"] > 0
        assert len(r["tokens"]) == 1 and len(r["tokens"][0]) == 7  # the prefill's token + 6 decoded
    summary = _read(out, "summary.json")
    assert (
        summary["gate"] == "pass" and summary["mode"] == "identical" and summary["first_difference"] is None
    )
    assert "B/A" in summary["direction"]
    for name in ("prefill_tok_s", "decode_tok_s"):
        metric = summary["metrics"][name]
        assert len(metric["pair_ratios"]) == 2 and 0.1 < metric["ratio"]["median"] < 10
        assert len(metric["drift_fit"]["log_residuals"]) == 4
    meta = _read(out, "metadata.json")
    assert meta["model"]["sha256"] == hashlib.sha256(tiny[0].read_bytes()).hexdigest()
    engine = "strata/engine/llm_engine.py"
    assert meta["arms"]["A"]["sources"][engine] == hashlib.sha256((ROOT / engine).read_bytes()).hexdigest()
    assert meta["arms"]["A"]["sources_sha256"] == meta["arms"]["B"]["sources_sha256"]
    assert meta["arms"]["A"]["worker"]["strata_file"] == str(ROOT / "strata" / "__init__.py")
    assert meta["harness"]["head"] and isinstance(meta["harness"]["dirty"], bool)
    assert "strata/bench/worker.py" in meta["harness_bench_sources"]
    assert {"python", "torch", "numpy", "llama-cpp-python", "transformers"} <= set(meta["versions"])
    assert meta["device"]["cpu"]["logical_cores"] >= 1 and meta["ab"]["gate"] == "identical"
    assert len(meta["prompts"][0]) == 12 and meta["workload"]["new_tokens"] == 6
    cache = json.loads((tmp_path / "home" / "bench" / "model-sha256.json").read_text())
    assert list(cache.values()) == [meta["model"]["sha256"]]


def test_ab_arms_with_different_tokens_fail_the_gate(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["bench", "ab", "strata", f"strata:model={tiny[1]}", "--model", str(tiny[0]), "--pairs", "1"]
    assert main([*argv, *FAST, "--out", str(out), "--warmup", "0"]) == 1
    summary = _read(out, "summary.json")
    assert summary["gate"] == "invalid" and summary["mode"] == "identical"
    assert summary["first_difference"]["arm"] == "B" and summary["first_difference"]["sequence"] == 0
    meta = _read(out, "metadata.json")
    assert meta["arms"]["B"]["model"]["sha256"] == hashlib.sha256(tiny[1].read_bytes()).hexdigest()


def test_ab_runs_a_commit_from_a_worktree(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["bench", "ab", "strata@HEAD", "strata", "--model", str(tiny[0]), "--pairs", "1", "--gate", "self"]
    assert main([*argv, *FAST, "--out", str(out), "--warmup", "0"]) == 0
    arm = _read(out, "metadata.json")["arms"]["A"]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert arm["commit"] == head.stdout.strip()
    assert arm["worker"]["strata_file"] == str(Path(arm["root"]) / "strata" / "__init__.py") != str(ROOT)
    listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True)
    assert arm["root"] not in listed.stdout and not Path(arm["root"]).exists()  # cleaned up


def test_decode_at_depth_and_batch_repeats_itself(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["bench", "decode", "--model", str(tiny[0]), "-d", "16", "-b", "2", "--repeats", "2"]
    assert main([*argv, *FAST, "--out", str(out)]) == 0
    summary = _read(out, "summary.json")
    assert summary["repeatable"] and summary["runs"] == 2 and set(summary["metrics"]) == {
        "prefill_tok_s", "decode_tok_s"
    }  # fmt: skip
    runs = _read(out, "runs.json")
    assert all(len(r["tokens"]) == 2 for r in runs)  # the prefix cache really served the depth (checked)


def test_depth_off_the_block_grid_and_cuda_are_clear_errors(
    tiny: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not torch.cuda.is_available():
        assert main(["bench", "prefill", "--device", "cuda", "--model", str(tiny[0])]) == 2
        assert "torch sees no CUDA GPU" in capsys.readouterr().err
    argv = ["bench", "decode", "--model", str(tiny[0]), "-d", "5", *FAST, "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "multiple of the block size 16" in capsys.readouterr().err


def test_transformers_peer_is_gated_against_itself(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    argv = ["bench", "ab", "strata", "transformers", "--model", str(tiny[0]), "--pairs", "1", "-b", "2"]
    assert main([*argv, *FAST, "--out", str(out), "--warmup", "0"]) == 0
    summary = _read(out, "summary.json")
    assert summary["mode"] == "self" and summary["gate"] == "pass"
    assert len(summary["agreement"]["common_prefix"]) == 2  # reported, not judged


def test_peer_worker_modules_leave_torch_unloaded() -> None:
    # A llamacpp worker must never load torch: on the GPU machine llama.cpp's CUDA libraries and
    # torch's crash when they share one process (strata/bench/peers.py).
    modules = "strata.bench.worker, strata.bench.peers, strata.bench.runners, strata.bench.workload"
    code = f"import sys; import {modules}; print([m for m in sys.modules if m.split('.')[0] == 'torch'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_worker_module_loads_no_cxx_library_before_the_peer() -> None:
    # llama.cpp's CUDA build crashed when numpy or torch was loaded first (strata/bench/worker.py):
    # the worker module itself must load neither, so a llamacpp worker loads llama_cpp first.
    code = "import sys; import strata.bench.worker; print(' '.join({m.split('.')[0] for m in sys.modules}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    loaded = set(out.stdout.split())
    assert not loaded & {"numpy", "torch", "llama_cpp"}, loaded


def test_llamacpp_peer_on_the_default_model(qwen_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")  # it cannot read the synthetic files (no BPE merges): the real model
    out = tmp_path / "out"
    argv = ["bench", "decode", "--arm", "llamacpp", "--model", str(qwen_path), "-p", "8", "-n", "2"]
    assert main([*argv, "--repeats", "1", "--warmup", "0", "--settle", "0", "--out", str(out)]) == 0
    runs = _read(out, "runs.json")
    assert len(runs) == 1 and len(runs[0]["tokens"][0]) == 3
