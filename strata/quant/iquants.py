"""Decoders for the codebook types IQ2_XS, IQ2_S, IQ4_NL and IQ4_XS.

Each takes a (n_blocks, type_size) uint8 tensor and returns (n_blocks, block_size) float32. The
grids, sign patterns and non-linear levels come from the tables gguf.quants itself carries.
"""

import functools

import numpy as np
import torch
from gguf import quants

from strata.quant._bits import f16, u16, unpack


@functools.cache
def _grid(name: str, device: torch.device) -> torch.Tensor:
    # gguf decodes its packed hex grid into float32 on first use; reuse that decoding.
    cls = getattr(quants, name)
    cls.init_grid()
    return torch.from_numpy(np.array(cls.grid, dtype=np.float32).reshape(cls.grid_shape)).to(device)


def _sign_table(patterns: torch.Tensor) -> torch.Tensor:
    # Bit i of a pattern set means element i is negated.
    bits = unpack(patterns, range(8), 0x01, dim=-1)
    return torch.where(bits == 0, 1.0, -1.0).to(torch.float32)


@functools.cache
def _ksigns(device: torch.device) -> torch.Tensor:
    # 128 even-parity 8-bit sign patterns, indexed by a 7-bit code.
    return _sign_table(torch.frombuffer(bytearray(quants.IQ2_XXS.ksigns), dtype=torch.uint8)).to(device)


@functools.cache
def _byte_signs(device: torch.device) -> torch.Tensor:
    return _sign_table(torch.arange(256, dtype=torch.int64).to(torch.uint8)).to(device)


@functools.cache
def _kvalues(device: torch.device) -> torch.Tensor:
    return torch.tensor(quants.IQ4_NL.kvalues, dtype=torch.float32, device=device)


def _iq2_scale(d: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    # 16 4-bit sub-block scales: db = d * (0.5 + s) * 0.25, evaluated left to right in float32.
    n = scales.shape[0]
    s = unpack(scales, (0, 4), 0x0F, dim=-1).reshape(n, 16).float()
    return (d * (s + 0.5) * 0.25).view(n, 16, 1, 1)


def iq2_xs(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, qs: 32 uint16 (9-bit grid index | 7-bit sign code << 9), scales: 8 bytes
    n = blocks.shape[0]
    qs = u16(blocks[:, 2:66])
    db = _iq2_scale(f16(blocks, 0), blocks[:, 66:74])
    grid = _grid("IQ2_XS", blocks.device)[qs & 511].view(n, 16, 2, 8)
    signs = _ksigns(blocks.device)[qs >> 9].view(n, 16, 2, 8)
    return (db * grid * signs).view(n, 256)


def iq2_s(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, qs: 32 bytes (low 8 index bits), signs: 32 bytes, qh: 8 bytes (2 high bits each), scales: 8
    n = blocks.shape[0]
    qh = unpack(blocks[:, 66:74], (0, 2, 4, 6), 0x03, dim=-1).reshape(n, 32)
    idx = blocks[:, 2:34].long() | (qh.long() << 8)
    db = _iq2_scale(f16(blocks, 0), blocks[:, 74:82])
    grid = _grid("IQ2_S", blocks.device)[idx].view(n, 16, 2, 8)
    signs = _byte_signs(blocks.device)[blocks[:, 34:66].long()].view(n, 16, 2, 8)
    return (db * grid * signs).view(n, 256)


def iq4_nl(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, qs: 16 bytes of 4-bit level indices (low nibbles first, as in Q4_0)
    n = blocks.shape[0]
    idx = unpack(blocks[:, 2:], (0, 4), 0x0F).reshape(n, 32)
    return f16(blocks, 0) * _kvalues(blocks.device)[idx.long()]


def iq4_xs(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, scales_h: uint16 (2 bits each), scales_l: 4 bytes (4 bits each), qs: 128 bytes
    n = blocks.shape[0]
    hi = unpack(u16(blocks[:, 2:4]), range(0, 16, 2), 0x03, dim=-1).reshape(n, 8)
    lo = unpack(blocks[:, 4:8], (0, 4), 0x0F, dim=-1).reshape(n, 8)
    dl = (f16(blocks, 0) * ((lo | (hi << 4)) - 32).float()).view(n, 8, 1)
    idx = unpack(blocks[:, 8:].reshape(n, 8, 16), (0, 4), 0x0F).reshape(n, 8, 32)
    return (dl * _kvalues(blocks.device)[idx.long()]).view(n, 256)
