"""Decoders for the 256-element k-quant super-blocks Q2_K, Q3_K, Q4_K, Q5_K and Q6_K.

Each takes a (n_blocks, type_size) uint8 tensor and returns (n_blocks, 256) float32. As in
gguf.quants, the fp16 super-block scale is first multiplied by each sub-block's integer scale
(one float32 rounding), and that sub-block scale then multiplies the integer quants.
"""

import torch

from strata.quant._bits import f16, unpack


def _crumbs(qs: torch.Tensor) -> torch.Tensor:
    # Each 32-byte chunk holds 128 consecutive elements as 2-bit fields, lowest bits first.
    return unpack(qs.reshape(qs.shape[0], -1, 32), (0, 2, 4, 6), 0x03).reshape(qs.shape[0], -1)


def _high_bits(hmask: torch.Tensor) -> torch.Tensor:
    # 32 bytes; bit j of byte i belongs to element 32 * j + i.
    return unpack(hmask, range(8), 0x01).reshape(hmask.shape[0], 256)


def _nibbles32(qs: torch.Tensor) -> torch.Tensor:
    # Each 32-byte chunk holds 64 consecutive elements: 32 low nibbles, then 32 high nibbles.
    return unpack(qs.reshape(qs.shape[0], -1, 32), (0, 4), 0x0F).reshape(qs.shape[0], -1)


def _scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # 12 bytes pack eight 6-bit scales and eight 6-bit mins (see Q4_K.get_scale_min in gguf).
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def q2_k(blocks: torch.Tensor) -> torch.Tensor:
    # scales: 16 bytes (low nibble scale, high nibble min), qs: 64 bytes, d: f16, dmin: f16
    n = blocks.shape[0]
    scales = blocks[:, 0:16]
    dl = (f16(blocks, 80) * (scales & 0x0F).float()).view(n, 16, 1)
    ml = (f16(blocks, 82) * (scales >> 4).float()).view(n, 16, 1)
    q = _crumbs(blocks[:, 16:80]).view(n, 16, 16).float()
    return (dl * q - ml).view(n, 256)


def q3_k(blocks: torch.Tensor) -> torch.Tensor:
    # hmask: 32 bytes, qs: 64 bytes, scales: 12 bytes (sixteen 6-bit values), d: f16
    n = blocks.shape[0]
    lo = unpack(blocks[:, 96:104], (0, 4), 0x0F).reshape(n, 16)
    hi = unpack(blocks[:, 104:108], (0, 2, 4, 6), 0x03).reshape(n, 16)
    scales = ((lo | (hi << 4)).to(torch.int8) - 32).float()
    dl = (f16(blocks, 108) * scales).view(n, 16, 1)
    # A set hmask bit means no offset; a clear one subtracts 4.
    qh = _high_bits(blocks[:, 0:32]) ^ 1
    q = (_crumbs(blocks[:, 32:96]).to(torch.int8) - (qh << 2).to(torch.int8)).float()
    return (dl * q.view(n, 16, 16)).view(n, 256)


def q4_k(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, dmin: f16, scales: 12 bytes, qs: 128 bytes
    n = blocks.shape[0]
    sc, mn = _scale_min(blocks[:, 4:16])
    d = (f16(blocks, 0) * sc.float()).view(n, 8, 1)
    dm = (f16(blocks, 2) * mn.float()).view(n, 8, 1)
    q = _nibbles32(blocks[:, 16:144]).view(n, 8, 32).float()
    return (d * q - dm).view(n, 256)


def q5_k(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, dmin: f16, scales: 12 bytes, qh: 32 bytes, qs: 128 bytes
    n = blocks.shape[0]
    sc, mn = _scale_min(blocks[:, 4:16])
    d = (f16(blocks, 0) * sc.float()).view(n, 8, 1)
    dm = (f16(blocks, 2) * mn.float()).view(n, 8, 1)
    q = (_nibbles32(blocks[:, 48:176]) | (_high_bits(blocks[:, 16:48]) << 4)).view(n, 8, 32).float()
    return (d * q - dm).view(n, 256)


def q6_k(blocks: torch.Tensor) -> torch.Tensor:
    # ql: 128 bytes, qh: 64 bytes, scales: 16 int8, d: f16
    n = blocks.shape[0]
    d = (f16(blocks, 208) * blocks[:, 192:208].view(torch.int8).float()).view(n, 16, 1)
    # ql: each 64-byte chunk holds 128 elements as 64 low then 64 high nibbles.
    ql = unpack(blocks[:, 0:128].reshape(n, 2, 64), (0, 4), 0x0F).reshape(n, 256)
    qh = _crumbs(blocks[:, 128:192])
    q = ((ql | (qh << 4)).to(torch.int8) - 32).view(n, 16, 16).float()
    return (d * q).view(n, 256)
