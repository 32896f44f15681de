"""Tensor parallelism on the CPU: 2 processes over gloo, tiny synthetic models.

Greedy ids through `LLM.generate` and `LLMEngine` equal the one-process run's (the gate), also for
models whose FFN splits unevenly and whose attn_output parts are zero-padded windows of whole blocks;
and no follower process outlives rank 0, whether it closes, fails a step, or is killed. The shard
helpers and start checks, which need no processes, are in tests/test_tensor_parallel_shard.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gguf.constants import GGMLQuantizationType

from strata import cli
from strata.engine.llm import LLM, ModelConfig
from strata.engine.llm_engine import EngineConfig, LLMEngine
from strata.engine.sampler import SamplingParams
from strata.engine.scheduler import SchedulerConfig
from strata.gguf.synth import SynthSpec, write_synthetic
from strata.models.base import DecoderModel
from strata.parallel.group import TensorParallel
from strata.parallel.leader import FollowerDied
from strata.server.config import ServerConfig
from strata.server.runtime import build_runtime
from strata.synth.layouts import Layout
from strata.synth.writer import write_layout

_T = GGMLQuantizationType
CUDA = torch.cuda.is_available()
GREEDY = SamplingParams(max_tokens=64, ignore_eos=True)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [(37 * j + 11) % 256 for j in range(20)]]
ENGINE_PROMPTS = [[(7 * i + 3 * j) % 256 for j in range(3 + 5 * i)] for i in range(4)]  # 3..18 tokens

# The K-quant model: llama.cpp's Q4_K_M mix (Q4_K, Q6_K, F32 biases) and the real 151,936-token vocab,
# shaped like the real layouts that do not fall on blocks over 2 ranks: the FFN is 3 blocks of 256
# (rank 0 takes 2, rank 1 one), and each rank's 3 heads of 128 are 1.5 blocks of attn_output's 768
# columns (each stores 2 blocks and zero-pads its input).
KQUANT = Layout(
    "tp-kquant", "qwen2", num_layers=2, hidden_size=512, ffn_size=768, num_heads=6, num_kv_heads=2,
    head_dim=128, context_length=512,
)  # fmt: skip
# The same two paths in Q8_0 blocks of 32: an FFN of 3 blocks, 3 heads of 16 (1.5 blocks) per rank.
UNEVEN = SynthSpec("qwen2", num_heads=6, num_kv_heads=2, head_dim=16, ffn_size=96, seed=2)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Seeds picked so that 64 greedy tokens are not one token repeated. The SynthSpec models have 257
    vocabulary rows, which split unevenly (129 + 128)."""
    folder = tmp_path_factory.mktemp("tp")
    specs = {
        "qwen2-q8_0": SynthSpec("qwen2", seed=2),  # Q/K/V biases, separate output head
        "gemma3-tied": SynthSpec("gemma3", tied_embeddings=True),  # head tied to the split embedding
        "qwen3-q4_0": SynthSpec("qwen3", weight_type=_T.Q4_0, seed=1),  # QK-norm
        "qwen2-uneven": UNEVEN,  # uneven FFN, windowed attn_output
    }
    paths = {name: write_synthetic(folder / f"{name}.gguf", spec) for name, spec in specs.items()}
    write_layout(folder / "kquant.gguf", KQUANT)
    return paths | {"qwen2-q4_k_m": folder / "kquant.gguf"}


@contextmanager
def tensor_parallel(path: Path, size: int = 2) -> Iterator[LLM]:
    llm = LLM(ModelConfig(path, tensor_parallel=size))
    threads = torch.get_num_threads()
    try:
        yield llm
    finally:
        llm.close()
        torch.set_num_threads(threads)


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for a reaper counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def _wait_gone(pids: list[int], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_gone(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


# ---- the same tokens as one process ------------------------------------------------------------


def _engine_ids(llm: LLM) -> tuple[list[list[int]], LLMEngine]:
    # Small blocks and a 16-token step budget: chunked prefill mixed with decodes, several caches' worth.
    scheduler = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16)
    engine = LLMEngine(
        llm.model, llm.tokenizer, EngineConfig(num_blocks=96, block_size=4, scheduler=scheduler)
    )
    requests = engine.generate(ENGINE_PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    return [r.output_ids for r in requests], engine


def _check_uneven_paths(model: DecoderModel, ffn_blocks: int, block_size: int) -> None:
    """Rank 0 of 2 holds the longer run of the FFN's blocks; its attn_output window is padded on the right."""
    for block in model.blk:
        assert block.ffn_down.in_features == -(-ffn_blocks // 2) * block_size
        assert block.ffn_down.pad is None
        assert block.attn_output.pad == (0, block_size // 2)


@pytest.mark.parametrize("name", ["qwen2-q8_0", "gemma3-tied", "qwen3-q4_0", "qwen2-q4_k_m", "qwen2-uneven"])
def test_greedy_ids_equal_one_process(models: dict[str, Path], name: str) -> None:
    one = LLM(ModelConfig(models[name]))
    expected = [list(one.generate(p, GREEDY)) for p in PROMPTS]
    expected_engine, _ = _engine_ids(one)
    expected_logits = one.prompt_logits(PROMPTS[1])
    assert all(len(ids) == 64 and len(set(ids)) >= 4 for ids in expected)  # not one token repeated
    with tensor_parallel(models[name]) as two:
        assert two.model.place.tp == TensorParallel(0, 2)
        if name == "qwen2-q4_k_m":
            _check_uneven_paths(two.model, 3, 256)
        if name == "qwen2-uneven":
            _check_uneven_paths(two.model, 3, 32)
        got = [list(two.generate(p, GREEDY)) for p in PROMPTS]
        got_engine, engine = _engine_ids(two)
        logits = two.prompt_logits(PROMPTS[1])
        assert engine.runner.kv.kv.shape[3] == one.spec.num_kv_heads // 2  # this rank's KV heads only
        followers = list(two.leader.followers) if two.leader else []
    assert got == expected
    assert got_engine == expected_engine
    engine.blocks.check_invariants()
    assert engine.blocks.num_free_blocks == engine.config.num_blocks
    # The all-reduces sum in another order than one matmul: the logits agree to float32 rounding.
    assert logits.shape == expected_logits.shape
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=1e-4)
    assert [p.returncode for p in followers] == [0]  # close() ended the follower cleanly


@pytest.mark.skipif(CUDA, reason="the kernel path on CPU tensors is for machines without a GPU")
def test_kernel_path_ids_equal_the_reference(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU path's layer logic (packed weight parts, stacked q/k/v with biases and gate/up, uneven FFN
    parts, zero-padded attn_output windows, paged decode attention over this rank's KV heads) in
    Triton's interpreter on 2 CPU ranks; only NCCL is left out."""
    # Triton picks the interpreter for each @jit as it is defined, its own library's at its import: set
    # first (the kernel test files set it at their import, so it is never unset when triton loads here).
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")

    def ids(llm: LLM) -> list[list[int]]:
        engine = LLMEngine(llm.model, llm.tokenizer, EngineConfig(num_blocks=64))
        prompts = [[(7 * i + 11 * j) % 200 + 3 for j in range(9 + 13 * i)] for i in range(3)]
        return [r.output_ids for r in engine.generate(prompts, SamplingParams(max_tokens=5, ignore_eos=True))]

    expected = ids(LLM(ModelConfig(models["qwen2-uneven"])))
    monkeypatch.setenv("STRATA_TRITON_ON_CPU", "1")  # read by rank 0's and the follower's Placement
    with tensor_parallel(models["qwen2-uneven"]) as two:
        assert two.model.place.kernels
        _check_uneven_paths(two.model, 3, 32)
        assert two.model.blk[0].attn_output.packed is not None  # the padded window's blocks, packed
        assert ids(two) == expected


def test_cli_generate_prints_the_same_text(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "--model", str(models["qwen2-q8_0"]), "--device", "cpu", "--max-tokens", "32", "ab"]
    threads = torch.get_num_threads()
    assert cli.main(argv) == 0
    expected = capsys.readouterr().out
    try:
        assert cli.main([*argv, "--tensor-parallel", "2"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert capsys.readouterr().out == expected
    assert not dist.is_initialized()  # generate closed the group and its follower
    for command in (["serve"], ["bench", "decode"], ["bench", "ab", "strata", "strata"]):
        assert cli._parser().parse_args([*command, "--tensor-parallel", "2"]).tensor_parallel == 2


def test_the_serving_stack_streams_the_same_tokens(models: dict[str, Path]) -> None:
    """`strata serve`'s stack: the engine thread on rank 0 drives the follower; close() ends it."""
    path, params = models["qwen3-q4_0"], SamplingParams(max_tokens=24, ignore_eos=True)
    expected = [list(LLM(ModelConfig(path)).generate(p, params)) for p in PROMPTS]
    threads = torch.get_num_threads()
    runtime = build_runtime(ModelConfig(path, tensor_parallel=2), EngineConfig(num_blocks=64), ServerConfig())
    try:

        async def stream(prompt: list[int]) -> list[int]:
            return [
                e.token_id async for e in runtime.engine.generate(prompt, params) if e.token_id is not None
            ]

        async def both() -> list[list[int]]:
            return list(await asyncio.gather(*(stream(p) for p in PROMPTS)))

        got = asyncio.run(asyncio.wait_for(both(), 60))
        followers = runtime.llm.leader.followers if runtime.llm.leader else []
    finally:
        runtime.close()
        torch.set_num_threads(threads)
    assert got == expected
    assert [p.returncode for p in followers] == [0]
    assert not dist.is_initialized()


# ---- nothing outlives rank 0 --------------------------------------------------------------------


def test_followers_run_with_nvlink_multicast_off(models: dict[str, Path]) -> None:
    with tensor_parallel(models["qwen2-q8_0"]) as llm:
        assert llm.leader is not None
        environ = Path(f"/proc/{llm.leader.followers[0].pid}/environ").read_bytes().split(b"\0")
    for setting in (b"NCCL_NVLS_ENABLE=0", b"TORCH_SYMM_MEM_DISABLE_MULTICAST=1", b"NVSHMEM_DISABLE_NVLS=1"):
        assert setting in environ
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"  # and in rank 0's own, before the group started


def test_a_failed_step_on_rank_0_ends_the_followers(models: dict[str, Path]) -> None:
    with tensor_parallel(models["qwen2-q8_0"]) as llm:
        assert llm.leader is not None

        def fail(*args: object) -> torch.Tensor:
            raise RuntimeError("injected failure")

        llm.model.forward = fail  # type: ignore[method-assign]  # after the step was announced
        with pytest.raises(RuntimeError, match="injected failure"):
            list(llm.generate(PROMPTS[0], GREEDY))
        assert all(p.poll() is not None for p in llm.leader.followers)
        with pytest.raises(FollowerDied, match="stopped"):
            list(llm.generate(PROMPTS[0], GREEDY))
    assert not dist.is_initialized()


def test_a_dead_follower_fails_the_next_step(models: dict[str, Path]) -> None:
    with tensor_parallel(models["qwen2-q8_0"]) as llm:
        assert llm.leader is not None
        follower = llm.leader.followers[0]
        follower.kill()
        follower.wait()
        with pytest.raises(FollowerDied, match=r"rank 1 exited with code -9"):
            list(llm.generate(PROMPTS[0], GREEDY))
    assert not dist.is_initialized()


_KILLED_LEADER = """
import os, signal, sys
from strata.engine.llm import LLM, ModelConfig
llm = LLM(ModelConfig(sys.argv[1], tensor_parallel=2))
print(" ".join(str(p.pid) for p in llm.leader.followers), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_followers_exit_when_rank_0_is_killed(models: dict[str, Path]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_LEADER, str(models["qwen2-q8_0"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 1
    assert _wait_gone(pids), f"follower {pids} still running after rank 0 was killed"


# ---- strata bench -------------------------------------------------------------------------------


def test_bench_ab_one_rank_against_two_passes_the_identical_gate(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRATA_HOME", str(tmp_path / "home"))  # the model-hash cache lands here
    out = tmp_path / "out"
    argv = ["bench", "ab", "strata", "strata:tensor_parallel=2", "--model", str(models["qwen3-q4_0"])]
    fast = ["-p", "12", "-n", "16", "--pairs", "1", "--warmup", "0", "--settle", "0", "--out", str(out)]
    assert cli.main([*argv, *fast]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gate"] == "pass" and summary["mode"] == "identical"


def test_bench_tensor_parallel_reaches_the_engine(
    models: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 4 heads do not split over 3 ranks: the worker's engine refuses, so the flag got there.
    monkeypatch.setenv("STRATA_HOME", str(tmp_path / "home"))
    argv = [
        "bench",
        "decode",
        "--tensor-parallel",
        "3",
        "--model",
        str(models["qwen2-q8_0"]),
        "--out",
        str(tmp_path),
    ]
    assert cli.main([*argv, "-p", "4", "-n", "2", "--repeats", "1", "--warmup", "0"]) == 2
    assert (
        "4 attention heads do not split evenly over 3 ranks (--tensor-parallel 3)" in capsys.readouterr().err
    )
