"""Dequantize GGUF tensor bytes to float32 with torch, bit-identical to gguf.quants.dequantize."""

import math
from collections.abc import Callable

import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from strata.quant import iquants, kquants, legacy
from strata.quant._bits import view_as

_T = GGMLQuantizationType


def _f32(blocks: torch.Tensor) -> torch.Tensor:
    # Copy so the result never aliases raw, which may be a read-only view of the file.
    return view_as(blocks, torch.float32).clone()


def _f16(blocks: torch.Tensor) -> torch.Tensor:
    return view_as(blocks, torch.float16).float()


def _bf16(blocks: torch.Tensor) -> torch.Tensor:
    # bf16 is the top half of a float32; shifting the bits keeps NaN payloads exactly as gguf does.
    return (view_as(blocks, torch.int16).to(torch.int32) << 16).view(torch.float32)


# Each decoder maps (n_blocks, type_size) uint8 to (n_blocks, block_size) float32.
_DECODERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], torch.Tensor]] = {
    _T.F32: _f32,
    _T.F16: _f16,
    _T.BF16: _bf16,
    _T.Q4_0: legacy.q4_0,
    _T.Q4_1: legacy.q4_1,
    _T.Q5_0: legacy.q5_0,
    _T.Q5_1: legacy.q5_1,
    _T.Q8_0: legacy.q8_0,
    _T.Q2_K: kquants.q2_k,
    _T.Q3_K: kquants.q3_k,
    _T.Q4_K: kquants.q4_k,
    _T.Q5_K: kquants.q5_k,
    _T.Q6_K: kquants.q6_k,
    _T.IQ2_XS: iquants.iq2_xs,
    _T.IQ2_S: iquants.iq2_s,
    _T.IQ4_NL: iquants.iq4_nl,
    _T.IQ4_XS: iquants.iq4_xs,
}

SUPPORTED_TYPES: frozenset[GGMLQuantizationType] = frozenset(_DECODERS)

# Decoding ~1M elements at a time keeps a decoder's byte-sized intermediates in cache; on large tables
# this is 2-3x faster than one pass over the whole tensor.
_CHUNK_ELEMS = 1 << 20


def _check(raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> tuple[int, int]:
    """Validate the arguments and return the type's (block_size, type_size)."""
    if qtype not in _DECODERS:
        name = getattr(qtype, "name", repr(qtype))
        supported = ", ".join(t.name for t in sorted(SUPPORTED_TYPES))
        raise ValueError(f"cannot dequantize GGML type {name}; supported types: {supported}")
    if raw.dtype != torch.uint8:
        raise TypeError(f"raw must be a uint8 tensor of the stored bytes, got {raw.dtype}")
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    cols = shape[-1] if shape else 1
    if cols % block_size:
        raise ValueError(f"{qtype.name} row length {cols} is not a multiple of its block size {block_size}")
    expected = math.prod(shape) // block_size * type_size
    if raw.numel() != expected:
        raise ValueError(
            f"{qtype.name} tensor of shape {tuple(shape)} takes {expected} bytes, but raw holds {raw.numel()}"
        )
    return block_size, type_size


def dequantize(raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> torch.Tensor:
    """Decode a GGUF tensor's stored bytes into a float32 tensor of `shape`.

    `raw` is a uint8 tensor (any shape, read only) holding exactly the tensor's bytes as stored in the
    file; `shape` is in torch order, its last dim being the contiguous one (GGUF's ne[0]). The result
    equals `gguf.quants.dequantize` bit for bit. Raises ValueError for a type outside SUPPORTED_TYPES
    or a byte count that does not match `shape`.
    """
    block_size, type_size = _check(raw, qtype, shape)
    blocks = raw.reshape(-1, type_size)
    decode = _DECODERS[qtype]
    step = max(1, _CHUNK_ELEMS // block_size)
    if block_size == 1 or blocks.shape[0] <= step:
        return decode(blocks).reshape(shape)
    out = torch.empty(blocks.shape[0], block_size, dtype=torch.float32, device=blocks.device)
    for start in range(0, blocks.shape[0], step):
        out[start : start + step] = decode(blocks[start : start + step])
    return out.reshape(shape)


def dequantize_rows(
    raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...], rows: torch.Tensor
) -> torch.Tensor:
    """Decode only the selected rows of a quantized 2-D table (e.g. an embedding lookup).

    `raw`, `qtype` and `shape` describe the whole tensor as for `dequantize`; every dim but the last
    counts as rows. `rows` holds integer row indices; the result is float32 of shape
    (len(rows), shape[-1]), equal to those rows of the full dequantization.
    """
    block_size, type_size = _check(raw, qtype, shape)
    cols = shape[-1] if shape else 1
    rows = rows.reshape(-1).long()
    table = raw.reshape(-1, cols // block_size * type_size)
    return dequantize(table.index_select(0, rows), qtype, (rows.numel(), cols))
