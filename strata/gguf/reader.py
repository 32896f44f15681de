"""A GGUF file opened by mmap: metadata as plain Python values, tensors as zero-copy byte views.

The layout (GGUF v2/v3): magic, version, tensor count, metadata count, the metadata key/values, the
tensor infos (name, dims, type, offset), then the tensor data at the next `general.alignment`
boundary. Every read is bounds-checked, so a damaged file fails here with a message naming what is
wrong instead of crashing later or loading a silently wrong model.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

GGUF_MAGIC = b"GGUF"
_SUPPORTED_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32

# GGUF metadata value types -> (struct format, numpy dtype); 8 = string, 9 = array.
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"),
    1: ("<b", "<i1"),
    2: ("<H", "<u2"),
    3: ("<h", "<i2"),
    4: ("<I", "<u4"),
    5: ("<i", "<i4"),
    6: ("<f", "<f4"),
    7: ("<?", "<u1"),
    10: ("<Q", "<u8"),
    11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_STRING, _ARRAY, _BOOL = 8, 9, 7


class GGUFError(ValueError):
    """The file is not a GGUF file this version of strata can load; the message says why."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry in the tensor table; `shape` is in torch order (GGUF's ne reversed)."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int


class _Cursor:
    """Bounds-checked little-endian reads over the mapped header."""

    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int, what: str) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise GGUFError(
                f"{self.path}: truncated GGUF file: reading {what} needs bytes {self.pos}..{end}, "
                f"but the file is {len(self.buf)} bytes; re-download or re-assemble it"
            )
        view = self.buf[self.pos : end]
        self.pos = end
        return view

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        raw = self.take(self.scalar("<Q", what), what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{self.path}: {what} is not valid UTF-8 ({e})") from None

    def value(self, vtype: int, key: str) -> Any:
        if vtype == _STRING:
            return self.string(key)
        if vtype == _ARRAY:
            return self.array(key)
        if vtype not in _SCALARS:
            raise GGUFError(f"{self.path}: metadata {key!r} has unknown value type {vtype}")
        value = self.scalar(_SCALARS[vtype][0], key)
        return bool(value) if vtype == _BOOL else value

    def array(self, key: str) -> list[Any]:
        etype = self.scalar("<I", key)
        count = self.scalar("<Q", key)
        if etype == _STRING:
            return [self.string(f"{key}[{i}]") for i in range(count)]
        if etype == _ARRAY:
            return [self.array(f"{key}[{i}]") for i in range(count)]
        if etype not in _SCALARS:
            raise GGUFError(f"{self.path}: metadata {key!r} is an array of unknown type {etype}")
        dtype = np.dtype(_SCALARS[etype][1])
        values = np.frombuffer(self.take(count * dtype.itemsize, key), dtype=dtype).tolist()
        return [bool(v) for v in values] if etype == _BOOL else values


class GGUFFile:
    """A GGUF file mapped into memory. Tensor bytes are never copied at open."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise GGUFError(f"{self.path}: no such GGUF file")
        if self.path.stat().st_size < 24:
            raise GGUFError(f"{self.path}: {self.path.stat().st_size} bytes is too short for a GGUF header")
        # Copy-on-write: torch can view the pages without a read-only warning; the file is never written.
        self._map = np.memmap(self.path, dtype=np.uint8, mode="c")
        cur = _Cursor(memoryview(self._map.data), self.path)
        magic = bytes(cur.take(4, "magic"))
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        self.version = cur.scalar("<I", "version")
        if self.version not in _SUPPORTED_VERSIONS:
            raise GGUFError(f"{self.path}: GGUF version {self.version} is not supported (only 2 and 3)")
        num_tensors = cur.scalar("<Q", "tensor count")
        num_kv = cur.scalar("<Q", "metadata count")
        self.metadata: dict[str, Any] = {}
        for _ in range(num_kv):
            key = cur.string("metadata key")
            self.metadata[key] = cur.value(cur.scalar("<I", key), key)
        infos = [self._read_tensor_info(cur) for _ in range(num_tensors)]
        alignment = int(self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        self.data_offset = -(-cur.pos // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, qtype, shape, rel, nbytes in infos:
            info = TensorInfo(name, qtype, shape, self.data_offset + rel, nbytes)
            if info.offset + nbytes > len(self._map):
                raise GGUFError(
                    f"{self.path}: tensor {name!r} runs past the end of the file (bytes {info.offset}.."
                    f"{info.offset + nbytes}, file is {len(self._map)} bytes): the file is truncated"
                )
            self.tensors[name] = info

    def _read_tensor_info(self, cur: _Cursor) -> tuple[str, GGMLQuantizationType, tuple[int, ...], int, int]:
        name = cur.string("tensor name")
        ndim = cur.scalar("<I", f"tensor {name!r} rank")
        dims = [cur.scalar("<Q", f"tensor {name!r} dims") for _ in range(ndim)]
        type_id = cur.scalar("<I", f"tensor {name!r} type")
        offset = cur.scalar("<Q", f"tensor {name!r} offset")
        try:
            qtype = GGMLQuantizationType(type_id)
            block_size, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise GGUFError(f"{self.path}: tensor {name!r} has unknown quant type id {type_id}") from None
        numel = int(np.prod(dims)) if dims else 1
        if dims and dims[0] % block_size:
            raise GGUFError(
                f"{self.path}: tensor {name!r} row of {dims[0]} values is not a multiple of "
                f"{qtype.name}'s block size {block_size}"
            )
        return name, qtype, tuple(reversed(dims)), offset, numel // block_size * type_size

    @cached_property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: metadata has no general.architecture")
        return arch

    def tensor_bytes(self, name: str) -> torch.Tensor:
        """The stored bytes of one tensor as a uint8 tensor viewing the mapped file (no copy)."""
        info = self.tensor_info(name)
        return torch.from_numpy(self._map[info.offset : info.offset + info.nbytes])

    def tensor_info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: tensor {name!r} is missing from the file") from None
