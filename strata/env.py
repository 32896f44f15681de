"""Every STRATA_* environment variable, declared in one place and read only here."""

from __future__ import annotations

import os
from pathlib import Path


def strata_home() -> Path:
    """STRATA_HOME: where assembled models live (default: the user's cache directory)."""
    explicit = os.environ.get("STRATA_HOME")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "strata"


def num_threads() -> int | None:
    """STRATA_NUM_THREADS: torch intra-op threads on the CPU (default: torch's own choice)."""
    value = os.environ.get("STRATA_NUM_THREADS")
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"STRATA_NUM_THREADS={value!r} is not a positive integer; unset it or set e.g. 2")
    return int(value)


def triton_on_cpu() -> bool:
    """STRATA_TRITON_ON_CPU=1: models built on the CPU take the GPU's kernel path (Triton kernels run
    in Triton's interpreter, which also needs TRITON_INTERPRET=1). For tests of that path without a GPU."""
    return os.environ.get("STRATA_TRITON_ON_CPU", "") not in ("", "0")


def q4k_layout() -> str:
    """STRATA_Q4K_LAYOUT: how Q4_K weights are packed for the GPU kernels, "blocks" (the GGUF blocks
    as stored) or "planar" (see strata.kernels.quant_pack); the default is "blocks"."""
    value = os.environ.get("STRATA_Q4K_LAYOUT", "") or "blocks"
    if value not in ("blocks", "planar"):
        raise ValueError(f"STRATA_Q4K_LAYOUT={value!r} is not a layout; set blocks or planar, or unset it")
    return value
