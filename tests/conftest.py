"""Shared fixtures: the real packaged models (assembled once) and a temp folder of synthetic ones."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from strata.engine.llm import ModelConfig
from strata.engine.llm_engine import EngineConfig
from strata.model_store import resolve_model
from strata.server.config import ServerConfig
from strata.server.model_config import shipped_config
from strata.server.runtime import Runtime, build_runtime
from tests.live_server import SERVED_MODEL, serving

# Under pytest-xdist (`make test` runs TEST_WORKERS, two by default: CI has two cores) each worker
# takes its share of the cores: torch's default, a thread per core in every worker, oversubscribes.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


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
