"""Decoders for the 32-element "legacy" block types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.

Each takes a (n_blocks, type_size) uint8 tensor and returns (n_blocks, 32) float32, with the
arithmetic of gguf.quants (float32 products of an fp16 scale and an integer quant, then the min).
"""

import torch

from strata.quant._bits import f16, unpack


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    # 16 bytes hold elements 0-15 in their low nibbles and 16-31 in their high nibbles.
    return unpack(qs, (0, 4), 0x0F).reshape(qs.shape[0], 32)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    # 4 bytes form a little-endian uint32 whose bit i is bit 4 of element i.
    return unpack(qh, range(8), 1, dim=-1).reshape(qh.shape[0], 32)


def q4_0(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, qs: 16 bytes
    q = _nibbles(blocks[:, 2:]).to(torch.int8) - 8
    return f16(blocks, 0) * q.float()


def q4_1(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, m: f16, qs: 16 bytes
    q = _nibbles(blocks[:, 4:]).float()
    return f16(blocks, 0) * q + f16(blocks, 2)


def q5_0(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, qh: 4 bytes, qs: 16 bytes
    q = (_nibbles(blocks[:, 6:]) | (_fifth_bits(blocks[:, 2:6]) << 4)).to(torch.int8) - 16
    return f16(blocks, 0) * q.float()


def q5_1(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, m: f16, qh: 4 bytes, qs: 16 bytes
    q = (_nibbles(blocks[:, 8:]) | (_fifth_bits(blocks[:, 4:8]) << 4)).float()
    return f16(blocks, 0) * q + f16(blocks, 2)


def q8_0(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, qs: 32 int8. Scaling the fresh float32 copy in place avoids a second 4-byte/element
    # allocation, which dominates the time on large token tables.
    return blocks[:, 2:].view(torch.int8).float().mul_(f16(blocks, 0))
