"""Shared fixtures: the real packaged models (assembled once) and a temp folder of synthetic ones."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# Without a GPU the kernel tests run Triton's interpreter, which Triton fixes at its first import
# (each kernel test module sets this too, for running alone).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from strata.engine.llm import ModelConfig  # noqa: E402
from strata.engine.llm_engine import EngineConfig  # noqa: E402
from strata.model_store import resolve_model  # noqa: E402
from strata.server.config import ServerConfig  # noqa: E402
from strata.server.model_config import shipped_config  # noqa: E402
from strata.server.runtime import Runtime, build_runtime  # noqa: E402
from tests.live_server import SERVED_MODEL, serving  # noqa: E402

# Under pytest-xdist (`make test` runs TEST_WORKERS, two by default: CI has two cores) each worker
# takes its share of the cores: torch's default, a thread per core in every worker, oversubscribes.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


def _interpret_without_overflow_checks() -> None:
    """Triton's interpreter builds an int32-overflow check for every integer add, sub and mul (int64
    copies of both sides, two comparisons) and then drops it unasserted, its options' `debug` being
    off (Triton 3.9 gives no way to turn it on): a third of the kernel tests' time for nothing
    (tests/test_kernels_quant_matvec.py's M=16 cases: 112 -> 77 s)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime import interpreter
    except ImportError:  # no triton: the kernel tests skip
        return
    builder = interpreter.interpreter_builder
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    _patch_language_once(interpreter)


def _patch_language_once(interpreter) -> None:
    """Triton's interpreter swaps triton.language's builtins for its own (`_patch_lang`, a scan of
    every member of tl, tl.tensor and tl.math) when a kernel starts, and restores them when its grid
    is done; but it scans again at every call of a nested @triton.jit function, in every program,
    where everything is already swapped and nothing changes (Triton 3.9). Skipped there: 35-45 % of the
    kernel tests' time (the Q4_K and Q6_K matvec tests 99 -> 55 s, the attention tests 31 -> 20 s).
    A function whose module holds a language module not yet swapped is patched as before."""
    import triton.language as tl

    patch_lang = interpreter._patch_lang

    def patch_unless_patched(fn):
        langs = [value for value in fn.__globals__.values() if value is tl or value is tl.core]
        if langs and not any(tl.core.is_builtin(lang.load) for lang in langs):
            return interpreter._LangPatchScope()  # nothing to restore: the running kernel's scope will
        return patch_lang(fn)

    interpreter._patch_lang = patch_unless_patched


_interpret_without_overflow_checks()


@pytest.fixture(scope="session")
def qwen_path() -> Path:
    return resolve_model("qwen2.5-coder-0.5b", progress=False)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return resolve_model("gemma-3-270m", progress=False)


@pytest.fixture(scope="session")
def runtime(qwen_path: Path) -> Iterator[Runtime]:
    """One serving stack on the default model with its shipped config, as `strata serve` runs it,
    shared by the API test files (one model load)."""
    server = ServerConfig(model_name=SERVED_MODEL)
    config = shipped_config(SERVED_MODEL)
    rt = build_runtime(ModelConfig(qwen_path), EngineConfig(num_blocks=1024), server, config)
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def base_url(runtime: Runtime) -> Iterator[str]:
    with serving(runtime.app) as url:
        yield url
