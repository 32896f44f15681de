"""The GGUF reader: metadata and tensors of real files, and a clear error for every damaged file."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from gguf.constants import GGMLQuantizationType

from strata.gguf.reader import GGUFError, GGUFFile
from strata.gguf.spec import ModelSpec
from strata.gguf.synth import SynthSpec, write_synthetic


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("synth") / "tiny.gguf", SynthSpec())


def test_default_model_spec(qwen_path: Path) -> None:
    gguf = GGUFFile(qwen_path)
    spec = ModelSpec.from_gguf(gguf)
    assert (spec.architecture, spec.num_layers, spec.hidden_size, spec.ffn_size) == ("qwen2", 24, 896, 4864)
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (14, 2, 64)
    assert (spec.vocab_size, spec.context_length, spec.rope_base) == (151_936, 32_768, 1e6)
    assert not spec.tied_embeddings and spec.rope_layout == "neox"
    types = [t.qtype for t in gguf.tensors.values()]
    assert types.count(GGMLQuantizationType.Q5_0) == 133 and types.count(GGMLQuantizationType.Q8_0) == 13
    assert gguf.tensors["output.weight"].qtype == GGMLQuantizationType.Q8_0


def test_gemma_spec(gemma_path: Path) -> None:
    spec = ModelSpec.from_gguf(GGUFFile(gemma_path))
    assert (spec.architecture, spec.num_layers, spec.head_dim, spec.sliding_window) == (
        "gemma3",
        18,
        256,
        512,
    )
    assert spec.tied_embeddings and spec.local_rope_base == 10_000.0
    assert [i for i, s in enumerate(spec.sliding_layers) if not s] == [5, 11, 17]
    assert spec.embed_scale == pytest.approx(640**0.5)


def test_tensors_are_views_of_the_mapped_file(qwen_path: Path) -> None:
    gguf = GGUFFile(qwen_path)
    info = gguf.tensors["token_embd.weight"]
    raw = gguf.tensor_bytes(info.name)
    assert raw.dtype == torch.uint8 and raw.numel() == info.nbytes == 151_936 * 896 // 32 * 22
    with open(qwen_path, "rb") as f:
        f.seek(info.offset)
        assert f.read(64) == raw[:64].numpy().tobytes()
    # Zero-copy: the tensor shares memory with the mapping, not a private buffer.
    assert raw.untyped_storage().data_ptr() == gguf._map[info.offset :].ctypes.data


def _expect(path: Path, match: str) -> None:
    with pytest.raises(GGUFError, match=match):
        GGUFFile(path)


def test_bad_magic(tmp_path: Path, synth_file: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + synth_file.read_bytes()[4:])
    _expect(bad, r"not a GGUF file \(magic b'GGML'")


def test_truncated_header(tmp_path: Path, synth_file: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(synth_file.read_bytes()[:300])
    _expect(cut, r"truncated GGUF file: reading .* needs bytes")


def test_tensor_past_end_of_file(tmp_path: Path, synth_file: Path) -> None:
    data = synth_file.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 100])
    _expect(
        cut, r"tensor '[a-z0-9_.]+' runs past the end of the file \(bytes \d+\.\.\d+, file is \d+ bytes\)"
    )


def test_too_short(tmp_path: Path) -> None:
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF")
    _expect(short, "too short")


def test_missing_file(tmp_path: Path) -> None:
    _expect(tmp_path / "nope.gguf", "no such GGUF file")


def _patch_first_tensor_type(data: bytes, name: bytes, type_id: int) -> bytes:
    # Tensor info: name (u64 len + bytes), n_dims u32, dims u64 * n, type u32, offset u64.
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    (ndim,) = struct.unpack_from("<I", data, at)
    at += 4 + 8 * ndim
    return data[:at] + struct.pack("<I", type_id) + data[at + 4 :]


def test_unknown_quant_type(tmp_path: Path, synth_file: Path) -> None:
    bad = tmp_path / "type.gguf"
    bad.write_bytes(_patch_first_tensor_type(synth_file.read_bytes(), b"token_embd.weight", 77))
    _expect(bad, r"tensor 'token_embd.weight' has unknown quant type id 77")


def test_unknown_architecture(tmp_path: Path) -> None:
    path = write_synthetic(tmp_path / "mamba.gguf", SynthSpec())
    data = path.read_bytes().replace(
        b"\x05\x00\x00\x00\x00\x00\x00\x00llama", b"\x05\x00\x00\x00\x00\x00\x00\x00mamba"
    )
    path.write_bytes(data)
    with pytest.raises(GGUFError, match=r"architecture 'mamba' is not supported"):
        ModelSpec.from_gguf(GGUFFile(path))


def test_missing_metadata_key(tmp_path: Path) -> None:
    path = write_synthetic(tmp_path / "t.gguf", SynthSpec())
    data = path.read_bytes().replace(b"llama.block_count", b"llama.block_cOunt")
    path.write_bytes(data)
    with pytest.raises(GGUFError, match=r"metadata llama.block_count is missing"):
        ModelSpec.from_gguf(GGUFFile(path))
