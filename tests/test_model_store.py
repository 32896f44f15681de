"""Assembling packaged models: streamed, verified, never half-written, with exact fix-it messages."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from strata import model_store
from strata.model_store import ModelNotAvailable, PackagedModel, assemble, resolve_model


@pytest.fixture
def chunk_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, PackagedModel]:
    """Two importable fake chunk packages and a PackagedModel over them."""
    parts = [b"GGUF" + bytes(range(200)) * 50, bytes(reversed(range(256))) * 30]
    for i, data in enumerate(parts, start=1):
        pkg = tmp_path / "site" / f"fake_chunk_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("STRATA_HOME", str(tmp_path / "home"))
    whole = b"".join(parts)
    model = PackagedModel(
        name="fake",
        filename="fake.gguf",
        sha256=hashlib.sha256(whole).hexdigest(),
        extra="fake",
        chunks=tuple((f"fake_chunk_part{i}", f"data/part{i:02d}.bin") for i in (1, 2)),
    )
    return whole, model


def test_assembles_and_verifies(chunk_packages: tuple[bytes, PackagedModel]) -> None:
    whole, model = chunk_packages
    path = assemble(model, progress=False)
    assert path == model_store.models_dir() / "fake.gguf"
    assert path.read_bytes() == whole
    assert assemble(model, progress=False) == path  # second call reuses the verified file
    assert not list(path.parent.glob("*.partial"))


def test_checksum_mismatch_leaves_nothing(chunk_packages: tuple[bytes, PackagedModel]) -> None:
    _, model = chunk_packages
    bad = PackagedModel(model.name, model.filename, "0" * 64, model.extra, model.chunks)
    with pytest.raises(
        ModelNotAvailable, match=r"expected 0{64}.*pip install --force-reinstall 'strata\[fake\]'"
    ):
        assemble(bad, progress=False)
    assert not list(model_store.models_dir().iterdir())


def test_missing_package_names_the_pip_command(chunk_packages: tuple[bytes, PackagedModel]) -> None:
    _, model = chunk_packages
    missing = PackagedModel("fake", "fake.gguf", model.sha256, "fake", (("fake_chunk_part9", "data/x.bin"),))
    sys.modules.pop("fake_chunk_part9", None)
    with pytest.raises(
        ModelNotAvailable,
        match=r"fake-chunk-part9, which is not installed; run: pip install 'strata\[fake\]'",
    ):
        assemble(missing, progress=False)


def test_unknown_model_name() -> None:
    with pytest.raises(ModelNotAvailable, match=r"neither a GGUF file nor a packaged model \(gemma-3-270m"):
        resolve_model("no-such-model")


def test_default_model_is_verified(qwen_path: Path) -> None:
    assert qwen_path.stat().st_size == 491_400_064
    assert model_store.sha256_file(qwen_path) == model_store.PACKAGED_MODELS["qwen2.5-coder-0.5b"].sha256
