"""Shared fixtures: the real packaged models (assembled once) and a temp folder of synthetic ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.model_store import resolve_model


@pytest.fixture(scope="session")
def qwen_path() -> Path:
    return resolve_model("qwen2.5-coder-0.5b", progress=False)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return resolve_model("gemma-3-270m", progress=False)
