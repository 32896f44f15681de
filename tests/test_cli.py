"""The command line end to end on the small Gemma model: info, streamed generation, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.cli import main


def test_info_describes_the_default_model(capsys: pytest.CaptureFixture[str], qwen_path: Path) -> None:
    assert main(["info", str(qwen_path)]) == 0
    out = capsys.readouterr().out
    assert "qwen2" in out and "24" in out and "32,768 tokens" in out
    assert "Q5_0 133" in out and "F32 121" in out and "Q8_0 13" in out
    assert any(line.startswith("chat template") and " yes (" in line for line in out.splitlines())


def test_generate_streams_greedy_text_and_stats(capsys: pytest.CaptureFixture[str], gemma_path: Path) -> None:
    prompt = "def is_prime(n: int) -> bool:\n    "
    argv = ["generate", prompt, "--model", str(gemma_path), "--max-tokens", "6"]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert first.out.startswith('"""\n')  # what transformers continues with too (test_model_parity)
    assert "prompt tokens" in first.err and "prefill" in first.err and "tok/s" in first.err
    assert main(argv) == 0
    assert capsys.readouterr().out == first.out  # greedy is deterministic


def test_seeded_sampling_repeats(capsys: pytest.CaptureFixture[str], gemma_path: Path) -> None:
    argv = ["generate", "Once upon a time", "--model", str(gemma_path), "--max-tokens", "8"]
    argv += ["--temperature", "0.9", "--top-p", "0.95", "--top-k", "40", "--seed", "11"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first


def test_chat_without_a_template_is_an_error(capsys: pytest.CaptureFixture[str], gemma_path: Path) -> None:
    assert main(["generate", "hi", "--chat", "--model", str(gemma_path), "--max-tokens", "2"]) == 2
    assert "has no chat template" in capsys.readouterr().err


def test_unknown_model_is_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["info", str(tmp_path / "missing.gguf")]) == 2
    assert "neither a GGUF file nor a packaged model" in capsys.readouterr().err


def test_context_overflow_names_the_limit(capsys: pytest.CaptureFixture[str], gemma_path: Path) -> None:
    assert main(["generate", "hi", "--model", str(gemma_path), "--max-tokens", "40000"]) == 2
    assert "exceed the model's context of 32,768" in capsys.readouterr().err


def test_device_and_dtype_choices(capsys: pytest.CaptureFixture[str], gemma_path: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        assert main(["generate", "x", "--model", str(gemma_path), "--device", "cuda"]) == 2
        assert "torch sees no CUDA GPU here; use --device cpu" in capsys.readouterr().err
    # auto on a CPU-only machine is the CPU in float32; float16 is accepted there too.
    argv = ["generate", "def f(", "--model", str(gemma_path), "--max-tokens", "2", "--dtype", "float16"]
    assert main([*argv, "--device", "auto"]) == 0
    assert "2 generated" in capsys.readouterr().err


def test_serve_enforce_eager_captures_no_graphs() -> None:
    from strata.cli import _engine_config, _parser

    eager = _engine_config(_parser().parse_args(["serve", "--enforce-eager", "--kv-tokens", "100"]))
    assert not eager.cuda_graphs and eager.prefill_graph_tokens == ()
    assert eager.num_blocks == 7 and eager.scheduler.max_num_seqs == 16
    default = _engine_config(_parser().parse_args(["serve"]))
    assert default.cuda_graphs and default.prefill_graph_tokens
