"""Write a synthetic GGUF for a `Layout`: real metadata and tensor table, random weights, fast.

The file is laid out up front (header, then every tensor at its aligned offset) and created at its
final size; worker threads then generate chunks of about 16 MiB and `pwrite` each at its offset, so
chunks finish in any order and memory stays at a few chunks per thread. numpy's bit generators and
`os.pwrite` release the GIL, so threads scale across cores. Each chunk has its own seed
(SeedSequence(seed, spawn_key=(tensor, chunk))): the bytes depend on the seed, never on the threads.
"""

from __future__ import annotations

import math
import os
import struct
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGUFValueType, LlamaFileType
from tqdm import tqdm

from strata.synth.blocks import random_data
from strata.synth.layouts import Layout, TensorPlan, plan_tensors
from strata.synth.tokenizer_meta import MetaValue, load_tokenizer_metadata

_V = GGUFValueType
_ALIGNMENT = 32
_CHUNK_BYTES = 16 << 20
_TOKEN_UNUSED = 5  # llama.cpp's token type for the [PADn] entries that pad a vocabulary
_NUMPY_TYPES = {
    _V.UINT8: "<u1", _V.INT8: "<i1", _V.UINT16: "<u2", _V.INT16: "<i2", _V.UINT32: "<u4",
    _V.INT32: "<i4", _V.FLOAT32: "<f4", _V.BOOL: "<u1", _V.UINT64: "<u8", _V.INT64: "<i8",
    _V.FLOAT64: "<f8",
}  # fmt: skip


def layout_metadata(s: Layout, seed: int = 0) -> dict[str, MetaValue]:
    """Every metadata key of the file: general.*, the architecture's keys, the real tokenizer."""
    arch = s.architecture
    u32 = _V.UINT32
    meta = {
        "general.architecture": MetaValue(_V.STRING, arch),
        "general.type": MetaValue(_V.STRING, "model"),
        "general.name": MetaValue(_V.STRING, f"strata synthetic {s.name} (random weights)"),
        f"{arch}.block_count": MetaValue(u32, s.num_layers),
        f"{arch}.context_length": MetaValue(u32, s.context_length),
        f"{arch}.embedding_length": MetaValue(u32, s.hidden_size),
        f"{arch}.feed_forward_length": MetaValue(u32, s.ffn_size),
        f"{arch}.attention.head_count": MetaValue(u32, s.num_heads),
        f"{arch}.attention.head_count_kv": MetaValue(u32, s.num_kv_heads),
    }
    if arch in ("qwen3", "qwen3moe") or s.head_dim * s.num_heads != s.hidden_size:
        meta[f"{arch}.attention.key_length"] = MetaValue(u32, s.head_dim)
        meta[f"{arch}.attention.value_length"] = MetaValue(u32, s.head_dim)
    meta[f"{arch}.rope.freq_base"] = MetaValue(_V.FLOAT32, s.rope_base)
    meta[f"{arch}.attention.layer_norm_rms_epsilon"] = MetaValue(_V.FLOAT32, s.rms_eps)
    if s.is_moe:
        meta[f"{arch}.expert_count"] = MetaValue(u32, s.num_experts)
        meta[f"{arch}.expert_used_count"] = MetaValue(u32, s.num_experts_used)
        meta[f"{arch}.expert_feed_forward_length"] = MetaValue(u32, s.expert_ffn_size)
    file_type = "MOSTLY_" + s.recipe if s.recipe != "F32" else "ALL_F32"
    if file_type in LlamaFileType.__members__:
        meta["general.file_type"] = MetaValue(u32, int(LlamaFileType[file_type]))
    meta["general.quantization_version"] = MetaValue(u32, 2)
    meta["strata.synthetic.layout"] = MetaValue(_V.STRING, s.name)
    meta["strata.synthetic.seed"] = MetaValue(_V.UINT64, seed)
    meta |= _tokenizer(s.vocab_size)
    return meta


def _tokenizer(vocab_size: int) -> dict[str, MetaValue]:
    meta = dict(load_tokenizer_metadata())
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    pad = range(len(tokens.value), vocab_size)
    if pad:  # as llama.cpp's converter pads Qwen2.5-7B's 152,064-row embedding
        meta["tokenizer.ggml.tokens"] = MetaValue(
            _V.ARRAY, [*tokens.value, *(f"[PAD{i}]" for i in pad)], _V.STRING
        )
        meta["tokenizer.ggml.token_type"] = MetaValue(
            _V.ARRAY, [*types.value, *[_TOKEN_UNUSED] * len(pad)], _V.INT32
        )
    return meta


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _scalar(vtype: GGUFValueType, value: object) -> bytes:
    if vtype == _V.STRING:
        return _string(str(value))
    return np.array(value, dtype=_NUMPY_TYPES[vtype]).tobytes()


def _value(v: MetaValue) -> bytes:
    head = struct.pack("<I", v.type)
    if v.type != _V.ARRAY:
        return head + _scalar(v.type, v.value)
    assert v.item_type is not None
    items = struct.pack("<IQ", v.item_type, len(v.value))
    if v.item_type == _V.STRING:
        return head + items + b"".join(_string(x) for x in v.value)
    return head + items + np.asarray(v.value, dtype=_NUMPY_TYPES[v.item_type]).tobytes()


def _align(n: int) -> int:
    return -(-n // _ALIGNMENT) * _ALIGNMENT


def gguf_header(meta: dict[str, MetaValue], plans: list[TensorPlan]) -> tuple[bytes, list[int]]:
    """The GGUF v3 header padded to the data section, and each tensor's absolute file offset."""
    parts = [b"GGUF", struct.pack("<IQQ", 3, len(plans), len(meta))]
    parts += [_string(key) + _value(v) for key, v in meta.items()]
    relative, pos = [], 0
    for p in plans:
        relative.append(pos)
        dims = tuple(reversed(p.shape))  # GGUF lists ne[0] (the contiguous dim) first
        parts.append(_string(p.name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, p.qtype, pos))
        pos = _align(pos + p.nbytes)
    header = b"".join(parts)
    header += bytes(_align(len(header)) - len(header))
    return header, [len(header) + r for r in relative]


@dataclass(frozen=True)
class _Chunk:
    tensor: int
    index: int
    offset: int  # absolute file offset
    first_block: int
    num_blocks: int


def _chunks(plans: list[TensorPlan], offsets: list[int]) -> Iterable[_Chunk]:
    for t, (p, base) in enumerate(zip(plans, offsets, strict=True)):
        _, type_size = GGML_QUANT_SIZES[p.qtype]
        step = max(1, _CHUNK_BYTES // type_size)
        for i, first in enumerate(range(0, p.num_blocks, step)):
            yield _Chunk(t, i, base + first * type_size, first, min(step, p.num_blocks - first))


def _fill(fd: int, plan: TensorPlan, chunk: _Chunk, seed: int) -> int:
    mean, std = {"norm": (1.0, 0.02), "bias": (0.0, 0.02)}.get(
        plan.role, (0.0, 1 / math.sqrt(plan.shape[-1]))
    )
    ss = np.random.SeedSequence(seed, spawn_key=(chunk.tensor, chunk.index))
    data = random_data(plan.qtype, chunk.num_blocks, mean, std, ss).data  # a memoryview, no copy
    written = 0
    while written < len(data):
        written += os.pwrite(fd, data[written:], chunk.offset + written)
    return written


@dataclass(frozen=True)
class WriteStats:
    path: Path
    num_tensors: int
    nbytes: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds else 0.0


def write_layout(
    path: str | Path, layout: Layout, seed: int = 0, threads: int | None = None, progress: bool = False
) -> WriteStats:
    """Write the synthetic GGUF of `layout` to `path` (atomically: a partial file never has the name)."""
    t0 = time.perf_counter()
    path = Path(path)
    plans = plan_tensors(layout)
    header, offsets = gguf_header(layout_metadata(layout, seed), plans)
    size = offsets[-1] + plans[-1].nbytes if plans else len(header)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    workers = threads or os.cpu_count() or 1
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)  # the gaps between tensors stay zero: the alignment padding
        os.pwrite(fd, header, 0)
        bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"synth {layout.name}", disable=not progress)
        with bar, ThreadPoolExecutor(workers) as pool:
            bar.update(len(header))
            jobs = [pool.submit(_fill, fd, plans[c.tensor], c, seed) for c in _chunks(plans, offsets)]
            for job in as_completed(jobs):
                bar.update(job.result())
        os.close(fd)
        fd = -1
        os.replace(partial, path)
    finally:
        if fd >= 0:
            os.close(fd)
        partial.unlink(missing_ok=True)
    return WriteStats(path, len(plans), size, time.perf_counter() - t0)
