"""What a result was measured on: commits, hashes of the code each arm loaded, the model file's hash,
the machine and the library versions. Written next to the runs as metadata.json."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from strata import env
from strata.model_store import sha256_file

from .trees import ArmTree, git

PACKAGES = ("torch", "numpy", "llama-cpp-python", "transformers", "gguf", "tokenizers")


def git_state(root: Path) -> dict[str, Any]:
    if not (root / ".git").exists():
        return {"root": str(root), "head": None, "dirty": None}
    changed = git(root, "status", "--porcelain").splitlines()
    return {
        "root": str(root),
        "head": git(root, "rev-parse", "HEAD"),
        "dirty": bool(changed),
        "dirty_files": [line[3:] for line in changed],
    }


def source_hashes(root: Path, package: str = "strata") -> dict[str, str]:
    """sha256 of every {package}/**/*.py under root, by relative path."""
    files = sorted((root / package).rglob("*.py"))
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def digest_of(hashes: dict[str, str]) -> str:
    """One sha256 over a path -> hash table, to compare whole trees at a glance."""
    return hashlib.sha256("".join(f"{k} {v}\n" for k, v in sorted(hashes.items())).encode()).hexdigest()


def arm_sources(tree: ArmTree) -> dict[str, Any]:
    hashes = source_hashes(tree.root)
    return {
        "root": str(tree.root),
        "commit": tree.commit,
        "sources_sha256": digest_of(hashes),
        "sources": hashes,
    }


def model_sha256(path: Path) -> str:
    """The file's sha256, cached under STRATA_HOME by path, size and mtime (hashing 0.5 GB takes seconds)."""
    path = path.resolve()
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    cache_path = env.strata_home() / "bench" / "model-sha256.json"
    try:
        cache: dict[str, str] = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key not in cache:
        cache[key] = sha256_file(path)
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        partial = cache_path.with_name(f"{cache_path.name}.{os.getpid()}")
        partial.write_text(json.dumps(cache, indent=1))
        os.replace(partial, cache_path)
    return cache[key]


def model_info(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"path": str(path.resolve()), "bytes": stat.st_size, "sha256": model_sha256(path)}


def _cpu() -> dict[str, Any]:
    info: dict[str, Any] = {"model": platform.processor() or None, "logical_cores": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            info["model"] = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
            info["flags"] = sorted(
                flags & {"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile"}
            )
            break
    return info


def device_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"cpu": _cpu(), "gpu": None, "driver": None, "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        info["gpu"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if shutil.which("nvidia-smi"):
            query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            done = subprocess.run(query, capture_output=True, text=True)
            info["driver"] = done.stdout.strip() or None
    return info


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found
