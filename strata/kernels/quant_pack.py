"""Regrouping GGUF block bytes into aligned planes for the fused matvec kernels.

A GGUF row is a run of blocks whose fields sit at offsets like 2 or 34 bytes, so the quants of most
types cannot be read with 16-byte loads. `pack_quant_weight` splits each block's fields into one
plane per field (all rows' scales, all rows' quants, ...), each a contiguous (N, bytes per row)
tensor. It only moves bytes: every value the kernels decode is the one `strata.quant.dequantize`
decodes from the raw tensor, and the planes hold exactly as many bytes as the raw tensor. Q4_K needs
no regrouping (its 144-byte blocks keep the quants 16-byte aligned), so its one plane is the raw
tensor itself. Pack once when a layer is built, not per call.

Q4_K also has a second layout, "planar" (`Q4_K_PLANAR`), made for a matvec whose every thread owns
whole 32-element sub-blocks: the 6-bit scales and mins unpacked to one byte each (planes sc and mn),
d and dmin side by side (plane dm), and each sub-block's 32 nibbles in 16 bytes (plane qs) ordered so
that nibble i of the sub-block's little-endian 32-bit word r is element 4i + r. The decoded values
are the same; the planes hold 148 bytes per 256 elements instead of 144. A third, "rows", is the
planar layout regrouped by ROWS rows (`interleave_rows`) for the int8 decode matvec of
`_matvec_q4k_rows`, whose warps take 32 rows of one sub-block; the other kernels read it through
`_bits.row_at`. "auto" (the default) packs each Q4_K weight as "rows" where it is large enough for
that kernel to gain (ROWS_FROM super-blocks or ROWS_FROM_K columns) and as "planar" otherwise.
STRATA_Q4K_LAYOUT picks the layout that layers are packed in.

Q6_K has a "rows" layout too (STRATA_Q6K_LAYOUT, its default): its four planes (ql, qh, scales, d)
regrouped by ROWS rows (`interleave_q6k_rows`) for the int8 decode matvec of `_matvec_q6k_rows`; the
other Q6_K kernels read it through `_bits.row_at`. "blocks" keeps the planes by row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from strata import env

_T = GGMLQuantizationType
LAYOUTS, Q6K_LAYOUTS = env.Q4K_LAYOUTS, env.Q6K_LAYOUTS
# Rows per group of the "rows" layout (the kernels take it as a constant). In the H100 sweep
# (RESULTS.md, thirteenth session) 32 ran the decode matvec 0-5 % faster; the matmul and the
# dequantizer that also read this layout were not timed at 32, so it stays.
ROWS = 64
# "auto": a Q4_K weight takes the "rows" layout from ROWS_FROM super-blocks (n * k / 256) or from
# ROWS_FROM_K columns. On an H100 (benchmarks/gpu_q4k_rows.py, RESULTS.md thirteenth and fourteenth
# sessions) its kernel at its best launch ran the 7B's gate+up (530k super-blocks) 1.15x and down (265k,
# k 18,944) 1.55x as fast as the planar default, the 1.5B's down (54k, k 8,960) 1.38x and gate+up
# (107k) 1.02x, but the 7B's q+k+v (64.5k) and o (50k) 0.89x and 0.90x and the 1.5B's 0.52x and
# 0.74x: short rows leave too few super-blocks a lane to hide a load's latency.
ROWS_FROM = 1 << 17
ROWS_FROM_K = 8192

# Per type: the planes as (start, end) byte ranges within one block, and each plane's element dtype.
_FIELDS: dict[GGMLQuantizationType, tuple[tuple[int, int, torch.dtype], ...]] = {
    # d fp16, qs int8[32]
    _T.Q8_0: ((2, 34, torch.uint8), (0, 2, torch.float16)),
    # d fp16, qh uint32 (bit i = bit 4 of element i), qs 16 bytes of nibbles
    _T.Q5_0: ((6, 22, torch.uint8), (2, 6, torch.int32), (0, 2, torch.float16)),
    # d fp16, qs 16 bytes of nibbles
    _T.Q4_0: ((2, 18, torch.uint8), (0, 2, torch.float16)),
    # the whole block: d, dmin, 12 scale bytes, 128 quant bytes
    _T.Q4_K: ((0, 144, torch.uint8),),
    # ql 128 bytes, qh 64 bytes, scales int8[16], d fp16
    _T.Q6_K: (
        (0, 128, torch.uint8),
        (128, 192, torch.uint8),
        (192, 208, torch.int8),
        (208, 210, torch.float16),
    ),
    # scales 16 bytes + qs 64 bytes (kept together: 80 bytes stay 16-byte aligned), then d, dmin fp16
    _T.Q2_K: ((0, 80, torch.uint8), (80, 84, torch.float16)),
    # qs 128 bytes of nibbles, scales_h uint16 + scales_l 4 bytes, d fp16
    _T.IQ4_XS: ((8, 136, torch.uint8), (2, 8, torch.uint8), (0, 2, torch.float16)),
    # qs 32 uint16 (9-bit grid index | 7-bit sign code << 9), scales 8 bytes, d fp16
    _T.IQ2_XS: ((2, 66, torch.int16), (66, 74, torch.uint8), (0, 2, torch.float16)),
    # qs 32 bytes, signs 32 bytes, qh 8 bytes, scales 8 bytes (80 bytes, 16-byte aligned), d fp16
    _T.IQ2_S: ((2, 82, torch.uint8), (0, 2, torch.float16)),
}
PACKABLE_TYPES: frozenset[GGMLQuantizationType] = frozenset(_FIELDS)


@dataclass(frozen=True)
class PackedQuantWeight:
    """An (n, k) GGUF weight as aligned per-field planes (see the module docstring for the order).
    `rows_group`: for the "rows" layout, the rows per group (ROWS), else 0."""

    qtype: GGMLQuantizationType
    n: int
    k: int
    planes: tuple[torch.Tensor, ...]
    rows_group: int = 0

    @property
    def layout(self) -> str:
        """ "planar" for Q4_K's four-plane layout, "rows" for Q4_K's or Q6_K's regrouping by rows (see
        the module docstring), else "blocks"."""
        if self.rows_group:
            return "rows"
        return "planar" if self.qtype == _T.Q4_K and len(self.planes) == 4 else "blocks"

    @property
    def planar(self) -> bool:
        """Whether Q4_K's planar kernels read it: Q4_K in the "planar" or the "rows" layout."""
        return self.qtype == _T.Q4_K and self.layout in ("planar", "rows")

    @property
    def device(self) -> torch.device:
        return self.planes[0].device

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.planes)


def check_weight_bytes(w_bytes: torch.Tensor, qtype: GGMLQuantizationType, n: int, k: int) -> None:
    """Raise a specific error unless `w_bytes` holds an (n, k) `qtype` tensor as GGUF stores it."""
    if qtype not in _FIELDS:
        supported = ", ".join(t.name for t in sorted(PACKABLE_TYPES))
        raise ValueError(f"no fused matvec for GGML type {qtype.name}; supported: {supported}")
    if w_bytes.dtype != torch.uint8:
        raise TypeError(f"weight bytes must be a uint8 tensor, got {w_bytes.dtype}")
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if n <= 0 or k <= 0 or k % block_size:
        raise ValueError(
            f"{qtype.name} needs n > 0 and k a positive multiple of {block_size}; got n={n}, k={k}"
        )
    expected = n * (k // block_size) * type_size
    if w_bytes.numel() != expected:
        raise ValueError(
            f"{qtype.name} weight of shape ({n}, {k}) takes {expected} bytes "
            f"(n * k / {block_size} * {type_size}), but the tensor holds {w_bytes.numel()}"
        )


def pack_quant_weight(
    w_bytes: torch.Tensor,
    qtype: GGMLQuantizationType,
    n: int,
    k: int,
    layout: str | None = None,
    q6k_layout: str | None = None,
) -> PackedQuantWeight:
    """Split raw GGUF bytes of an (n, k) weight into the planes the matvec kernels read.

    `layout` matters for Q4_K only: "blocks", "planar", "rows" or "auto" (rows from ROWS_FROM
    super-blocks or ROWS_FROM_K columns, else planar; default: STRATA_Q4K_LAYOUT). `q6k_layout` for
    Q6_K only: "blocks" or "rows" (default: STRATA_Q6K_LAYOUT)."""
    check_weight_bytes(w_bytes, qtype, n, k)
    layout = layout or env.q4k_layout()
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    q6k_layout = q6k_layout or env.q6k_layout()
    if q6k_layout not in Q6K_LAYOUTS:
        raise ValueError(f"q6k_layout must be one of {Q6K_LAYOUTS}, got {q6k_layout!r}")
    if layout == "auto":
        layout = "rows" if n * (k // 256) >= ROWS_FROM or k >= ROWS_FROM_K else "planar"
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = w_bytes.reshape(n, k // block_size, type_size)
    if qtype == _T.Q4_K and layout == "planar":
        return PackedQuantWeight(qtype, n, k, _q4_k_planes(blocks))
    if qtype == _T.Q4_K and layout == "rows":
        return PackedQuantWeight(qtype, n, k, interleave_rows(_q4_k_planes(blocks), ROWS), ROWS)
    planes = []
    for start, end, dtype in _FIELDS[qtype]:
        plane = blocks[:, :, start:end]
        # A fresh copy unless the field already is a whole aligned tensor (Q4_K's raw bytes).
        if not plane.is_contiguous() or plane.storage_offset() % 16:
            plane = plane.clone(memory_format=torch.contiguous_format)
        planes.append(plane.view(dtype).reshape(n, -1))
    if qtype == _T.Q6_K and q6k_layout == "rows":
        return PackedQuantWeight(qtype, n, k, interleave_q6k_rows(tuple(planes), ROWS), ROWS)
    return PackedQuantWeight(qtype, n, k, tuple(planes))


def widen_q5_0(w: PackedQuantWeight) -> PackedQuantWeight:
    """A packed Q5_0 weight rewritten as Q8_0 with the same values: each element's 5-bit q becomes the
    int8 q - 16 under the same fp16 d (Q5_0 decodes d * (q - 16), Q8_0 d * q), 34 bytes a block
    instead of 22. For stacking a few Q5_0 rows with Q8_0 neighbours into one launch
    (STRATA_WIDEN_TO_STACK), where the bytes added cost less than a launch."""
    if w.qtype != _T.Q5_0:
        raise ValueError(f"widen_q5_0 takes a Q5_0 weight, got {w.qtype.name}")
    qs, qh, d = w.planes
    nb = w.k // 32
    nibbles = qs.reshape(w.n, nb, 16).to(torch.int32)
    high = qh.reshape(w.n, nb, 1)
    i = torch.arange(16, device=qs.device)
    low_half = (nibbles & 15) | (((high >> i) & 1) << 4)  # elements 0..15
    high_half = (nibbles >> 4) | (((high >> (i + 16)) & 1) << 4)  # elements 16..31
    q = torch.cat([low_half, high_half], dim=-1) - 16
    q8 = q.to(torch.int8).view(torch.uint8).reshape(w.n, w.k).contiguous()
    return PackedQuantWeight(_T.Q8_0, w.n, w.k, (q8, d))


def _q4_k_planes(blocks: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(n, k / 256, 144) Q4_K blocks -> the planar layout's qs, sc, mn (uint8) and dm (fp16) planes."""
    n, nb, _ = blocks.shape
    raw = blocks.to(torch.int32)
    # gguf's get_scale_min: sub-block j < 4 keeps 6 bits of bytes j (scale) and j + 4 (min); j >= 4
    # takes 4 bits from byte j + 4 and the top 2 bits of bytes j - 4 (scale) and j (min).
    s = raw[:, :, 4:16]
    sc = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], dim=-1)
    mn = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], dim=-1)
    # Chunk c's 32 bytes: low nibbles are sub-block 2c, high nibbles 2c + 1, element u at byte u.
    qs = raw[:, :, 16:].reshape(n, nb, 4, 1, 32)
    nib = torch.cat([qs & 15, qs >> 4], dim=3).reshape(n, nb, 8, 8, 4)  # (.., sub-block, i, r): u = 4i + r
    nib = nib.transpose(3, 4)  # (.., r, i): word r's nibble i
    packed = nib[..., 0::2] | (nib[..., 1::2] << 4)  # byte i // 2 of word r
    planes = (packed, sc, mn)
    qs_plane, sc_plane, mn_plane = (p.to(torch.uint8).reshape(n, -1).contiguous() for p in planes)
    dm = blocks[:, :, 0:4].contiguous().view(torch.float16).reshape(n, -1)
    return qs_plane, sc_plane, mn_plane, dm


def interleave_rows(planes: tuple[torch.Tensor, ...], rows: int) -> tuple[torch.Tensor, ...]:
    """The planar layout's planes (qs, sc, mn uint8, dm fp16) regrouped by `rows` rows, for G =
    ceil(n / rows) groups, each plane (G, ...): qs (G, n_sub, rows, 16 bytes); each row's super-block
    scales and mins as one record, (G, n_blocks, rows, 16) bytes (sc of its 8 sub-blocks, then mn);
    dm (G, n_blocks, rows, 2) fp16 (d, dmin). Rows past n are zero (their outputs are not stored).
    The same bytes as the planar planes, moved; `deinterleave_rows` is the inverse."""
    qs, sc, mn, dm = planes
    n = qs.shape[0]
    scm = torch.cat([sc.reshape(n, -1, 8), mn.reshape(n, -1, 8)], dim=2).reshape(n, -1)
    return regroup_rows(qs, rows, 16), regroup_rows(scm, rows, 16), regroup_rows(dm, rows, 2)


def regroup_rows(plane: torch.Tensor, rows: int, unit: int) -> torch.Tensor:
    """An (n, c) plane as (ceil(n / rows), c * rows): each run of `unit` columns of a group's rows
    side by side, rows past n zero."""
    n = plane.shape[0]
    groups = -(-n // rows)
    padded = torch.zeros(groups * rows, plane.shape[1], dtype=plane.dtype, device=plane.device)
    padded[:n] = plane
    units = padded.reshape(groups, rows, -1, unit).transpose(1, 2)
    return units.contiguous().reshape(groups, -1)


def ungroup_rows(plane: torch.Tensor, n: int, rows: int, unit: int) -> torch.Tensor:
    """The (n, c) plane that `regroup_rows(plane, rows, unit)` regrouped (its first n rows)."""
    groups = plane.shape[0]
    units = plane.reshape(groups, -1, rows, unit).transpose(1, 2)
    return units.contiguous().reshape(groups * rows, -1)[:n]


# Q6_K's planes (ql, qh uint8, scales int8, d fp16) in the "rows" layout: the units regrouped, in
# elements of each plane. A 16-byte unit of ql and qh is one lane's load; a half super-block's 8 scales
# one 8-byte load; d one a row and super-block.
Q6K_UNITS = (16, 16, 8, 1)


def interleave_q6k_rows(planes: tuple[torch.Tensor, ...], rows: int) -> tuple[torch.Tensor, ...]:
    """Q6_K's packed planes (ql, qh, scales, d) regrouped by `rows` rows, each (G, ...) for G =
    ceil(n / rows), in units of `Q6K_UNITS`. The same bytes, moved; rows past n are zero."""
    return tuple(regroup_rows(p, rows, u) for p, u in zip(planes, Q6K_UNITS, strict=True))


def deinterleave_q6k_rows(planes: tuple[torch.Tensor, ...], n: int, rows: int) -> tuple[torch.Tensor, ...]:
    """Q6_K's packed planes (ql, qh, scales, d) of the first n rows of `interleave_q6k_rows`."""
    return tuple(ungroup_rows(p, n, rows, u) for p, u in zip(planes, Q6K_UNITS, strict=True))


def deinterleave_rows(planes: tuple[torch.Tensor, ...], n: int, rows: int) -> tuple[torch.Tensor, ...]:
    """The planar planes (qs, sc, mn, dm) of the first n rows of `interleave_rows(planes, rows)`."""
    qs, scm, dm = planes
    records = ungroup_rows(scm, n, rows, 16).reshape(n, -1, 16)
    sc, mn = (records[:, :, half].reshape(n, -1).contiguous() for half in (slice(0, 8), slice(8, 16)))
    return ungroup_rows(qs, n, rows, 16), sc, mn, ungroup_rows(dm, n, rows, 2)


def stack_packed(parts: list[PackedQuantWeight]) -> PackedQuantWeight:
    """One packed weight whose rows are the parts' rows in order (the same bytes): parts of one type,
    layout and k. The "rows" layouts are regrouped again over the stacked rows (a group may span
    parts)."""
    first = parts[0]
    n = sum(p.n for p in parts)
    if first.layout != "rows":
        planes = tuple(torch.cat(group) for group in zip(*(p.planes for p in parts), strict=True))
        return PackedQuantWeight(first.qtype, n, first.k, planes)
    rows = first.rows_group
    split, join = (
        (deinterleave_rows, interleave_rows) if first.planar else (deinterleave_q6k_rows, interleave_q6k_rows)
    )
    ungrouped = [split(p.planes, p.n, rows) for p in parts]
    stacked = tuple(torch.cat(group) for group in zip(*ungrouped, strict=True))
    return PackedQuantWeight(first.qtype, n, first.k, join(stacked, rows), rows)


def rows_planes(w: PackedQuantWeight, paired_dm: bool = False) -> tuple[list[torch.Tensor], list[int]]:
    """The "rows" layout's planes as the planar kernels take them (qs, sc, mn, dm), with a group's
    strides: the words (int32), the scale records (sc first), the same 8 bytes on (mn), and dm (fp16,
    or with `paired_dm` int32: d and dmin in one word)."""
    qs, scm, dm = w.planes
    planes = [qs.view(torch.int32), scm, scm.view(-1)[8:], dm.view(torch.int32) if paired_dm else dm]
    return planes, [planes[0].stride(0), scm.stride(0), scm.stride(0), planes[3].stride(0)]
