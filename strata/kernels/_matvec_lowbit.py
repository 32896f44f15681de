"""Fused dequant + matvec kernels for the low-bit types Q2_K, IQ4_XS, IQ2_XS and IQ2_S.

Same structure as `_matvec_legacy` and `_matvec_kquant`: BLOCK_N output rows per program, a 1/SPLIT_K
share of K, the quants turned into exact float32 values and dotted with x per group of elements that
share a scale, and that group's float32 scale (rounded as gguf rounds it) applied to the group's sum.
Where the reference rounds every weight (Q2_K: d * sc * q - dmin * mn; IQ4_XS: d * sc * level; IQ2:
d * (sc + 0.5) * 0.25 * grid * sign), these compute d * sc * sum(q * x) - dmin * mn * sum(x), and so
on: the same weights, a different rounding order, within fp32 tolerance of the reference.

The codebook types read their values from the small tables of `codebook` (gguf.quants' own tables,
one copy per device), passed as the last pointer before N.
"""

import functools

import numpy as np
import torch
import triton
import triton.language as tl
from gguf import quants
from gguf.constants import GGMLQuantizationType

from strata.kernels._bits import add_to_row, exact_float, split_range, store_rows
from strata.kernels.pdl import await_inputs

_T = GGMLQuantizationType
# Where IQ2_XS's 128 sign patterns start in its table, after the 512 grid rows of 8 bytes.
IQ2_XS_SIGNS: tl.constexpr = tl.constexpr(512 * 8)


@functools.cache
def codebook(qtype: GGMLQuantizationType, device: torch.device) -> torch.Tensor:
    """The lookup table the kernels of `qtype` read, built once per device from gguf.quants' tables.

    IQ4_XS: the 16 non-linear levels as float32. IQ2_XS: its 512 grid rows of 8 uint8 values (8, 25
    or 43), then the 128 ksigns patterns at IQ2_XS_SIGNS. IQ2_S: its 1024 grid rows of 8 uint8 values.
    Build it before a CUDA graph capture (a warm-up call does): creating it copies from the host.
    """
    if qtype == _T.IQ4_XS:
        return torch.tensor(quants.IQ4_NL.kvalues, dtype=torch.float32, device=device)
    if qtype not in (_T.IQ2_XS, _T.IQ2_S):
        raise ValueError(f"GGML type {qtype.name} has no codebook; IQ4_XS, IQ2_XS and IQ2_S have")
    cls = quants.IQ2_XS if qtype == _T.IQ2_XS else quants.IQ2_S
    cls.init_grid()
    grid = np.asarray(cls.grid, dtype=np.float32).reshape(-1)
    table = torch.from_numpy(grid.astype(np.uint8))
    assert torch.equal(table.float(), torch.from_numpy(grid)), "grid values are no longer small integers"
    if qtype == _T.IQ2_XS:
        table = torch.cat([table, torch.frombuffer(bytearray(quants.IQ2_XXS.ksigns), dtype=torch.uint8)])
    return table.to(device)


@triton.jit
def q2_k_matvec_kernel(
    x_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, w_ptr, dm_ptr,
    N, K,
    stride_xm, stride_ys, stride_ym, stride_w, stride_dm,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    await_inputs(PDL)
    # Work goes in halves of a super-block (128 elements); a block is 80 plane bytes (16 scale bytes,
    # then 64 quant bytes) and d, dmin in the fp16 plane. Element 128h + 32s + i (s = 0..3,
    # i = 0..31) of half h is bits 2s, 2s+1 of quant byte 32h + i, in sub-block 8h + 2s + i // 16,
    # whose scale byte holds sc (low nibble) and mn (high): w = d * sc * q - dmin * mn.
    NH: tl.constexpr = BLOCK_K // 128
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    # Clamped rows load valid bytes; only the store is masked, so the loads need no row mask.
    rc = tl.minimum(rows, N - 1)
    ih = tl.arange(0, NH)
    ij = tl.arange(0, 32)
    it = tl.arange(0, 2)
    lo, hi = split_range(K // 128, NH, SPLIT_K)
    acc = tl.zeros((M_PAD, BLOCK_N), tl.float32)
    for g0 in range(lo, hi, NH):
        g = g0 + ih  # (NH,) half index along the row
        gm = g < hi
        m3 = gm[None, :, None]
        blk = (rc[:, None] * stride_w + (g // 2)[None, :] * 80)[:, :, None]  # (BLOCK_N, NH, 1)
        h = (g % 2)[None, :, None]
        q = tl.load(w_ptr + blk + 16 + h * 32 + ij[None, None, :], mask=m3, other=0).to(tl.int32)
        dm_at = dm_ptr + rc[:, None] * stride_dm + (g // 2)[None, :] * 2
        d = tl.load(dm_at, mask=gm[None, :], other=0).to(tl.float32)[:, :, None]
        dmin = tl.load(dm_at + 1, mask=gm[None, :], other=0).to(tl.float32)[:, :, None]
        for s in tl.static_range(4):
            w = tl.reshape(exact_float((q >> (2 * s)) & 3, 0), (BLOCK_N, NH, 2, 16))
            sc = tl.load(w_ptr + blk + h * 8 + 2 * s + it[None, None, :], mask=m3, other=0).to(tl.int32)
            dl = d * exact_float(sc & 15, 0)  # (BLOCK_N, NH, 2)
            ml = dmin * exact_float(sc >> 4, 0)
            x_off = g[:, None, None] * 128 + 32 * s + it[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]
            for m in tl.static_range(M):
                xv = tl.load(x_ptr + m * stride_xm + x_off, mask=gm[:, None, None], other=0).to(tl.float32)
                part = dl * tl.sum(w * xv[None, :, :, :], 3) - ml * tl.sum(xv, 2)[None, :, :]
                acc = add_to_row(acc, tl.sum(tl.sum(part, 2), 1), m, M_PAD)
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym,
               M, M_PAD, b_ptr, HAS_BIAS, SPLIT_K)  # fmt: skip


@triton.jit
def iq4_xs_matvec_kernel(
    x_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, qs_ptr, sc_ptr, d_ptr, kv_ptr,
    N, K,
    stride_xm, stride_ys, stride_ym, stride_qs, stride_sc, stride_d,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    await_inputs(PDL)
    # Sub-block t (32 elements) of a row is sub-block j = t % 8 of block t // 8: quant bytes 16t + i
    # hold level indices of element i (low nibble) and 16 + i (high). Its 6-bit scale has its low 4
    # bits in nibble j % 2 of scales_l byte j // 2 and its high 2 in bits 2j, 2j+1 of scales_h, which
    # are the block's first two scale-plane bytes: w = d * (scale - 32) * kvalues[index].
    NB: tl.constexpr = BLOCK_K // 32
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rc = tl.minimum(rows, N - 1)
    ib = tl.arange(0, NB)
    ij = tl.arange(0, 16)
    lo, hi = split_range(K // 32, NB, SPLIT_K)
    acc = tl.zeros((M_PAD, BLOCK_N), tl.float32)
    for t0 in range(lo, hi, NB):
        t = t0 + ib
        tm = t < hi
        q = tl.load(
            qs_ptr + rc[:, None, None] * stride_qs + t[None, :, None] * 16 + ij[None, None, :],
            mask=tm[None, :, None],
            other=0,
        ).to(tl.int32)  # (BLOCK_N, NB, 16)
        w_lo = tl.load(kv_ptr + (q & 15))
        w_hi = tl.load(kv_ptr + (q >> 4))
        hdr = rc[:, None] * stride_sc + (t // 8)[None, :] * 6  # (BLOCK_N, NB)
        j = (t % 8)[None, :]
        sl = tl.load(sc_ptr + hdr + 2 + j // 2, mask=tm[None, :], other=0).to(tl.int32)
        sh = tl.load(sc_ptr + hdr + j // 4, mask=tm[None, :], other=0).to(tl.int32)
        scale = ((sl >> (4 * (j % 2))) & 15) | (((sh >> (2 * (j % 4))) & 3) << 4)
        d = tl.load(d_ptr + rc[:, None] * stride_d + (t // 8)[None, :], mask=tm[None, :], other=0)
        dl = d.to(tl.float32) * exact_float(scale, 32)
        for m in tl.static_range(M):
            x_at = x_ptr + m * stride_xm + t[:, None] * 32 + ij[None, :]
            x_lo = tl.load(x_at, mask=tm[:, None], other=0).to(tl.float32)[None, :, :]
            x_hi = tl.load(x_at + 16, mask=tm[:, None], other=0).to(tl.float32)[None, :, :]
            part = tl.sum((tl.sum(w_lo * x_lo, 2) + tl.sum(w_hi * x_hi, 2)) * dl, 1)
            acc = add_to_row(acc, part, m, M_PAD)
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym,
               M, M_PAD, b_ptr, HAS_BIAS, SPLIT_K)  # fmt: skip


@triton.jit
def iq2_scale(d, sc):
    """d * (sc + 0.5) * 0.25 for a 4-bit scale sc, rounded left to right as gguf rounds it."""
    return d * (exact_float(sc, 0) + 0.5) * 0.25


@triton.jit
def grid_value(grid_ptr, index, pattern, e):
    """Element e (0..7) of grid row `index` as float32, negated where bit e of `pattern` is set
    (arguments broadcast together)."""
    v = exact_float(tl.load(grid_ptr + index * 8 + e).to(tl.int32), 0)
    return tl.where(((pattern >> e) & 1) != 0, -v, v)


@triton.jit
def iq2_xs_matvec_kernel(
    x_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, qs_ptr, sc_ptr, d_ptr, tab_ptr,
    N, K,
    stride_xm, stride_ys, stride_ym, stride_qs, stride_sc, stride_d,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    await_inputs(PDL)
    # Group g (8 elements) of a row is uint16 quant g: grid row q & 511 signed by the ksigns pattern
    # q >> 9. It shares the scale of sub-block g // 2: nibble (g // 2) % 2 of scale byte g // 4, with
    # the d of block g // 32.
    NG: tl.constexpr = BLOCK_K // 8
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rc = tl.minimum(rows, N - 1)
    ig = tl.arange(0, NG)
    ie = tl.arange(0, 8)
    lo, hi = split_range(K // 8, NG, SPLIT_K)
    acc = tl.zeros((M_PAD, BLOCK_N), tl.float32)
    for g0 in range(lo, hi, NG):
        g = g0 + ig
        gm = g[None, :] < hi
        # The plane is int16: the mask drops the sign extension.
        q = tl.load(qs_ptr + rc[:, None] * stride_qs + g[None, :], mask=gm, other=0).to(tl.int32) & 0xFFFF
        pattern = tl.load(tab_ptr + IQ2_XS_SIGNS + (q >> 9)).to(tl.int32)
        w = grid_value(tab_ptr, (q & 511)[:, :, None], pattern[:, :, None], ie[None, None, :])
        sc = tl.load(sc_ptr + rc[:, None] * stride_sc + (g // 4)[None, :], mask=gm, other=0).to(tl.int32)
        d = tl.load(d_ptr + rc[:, None] * stride_d + (g // 32)[None, :], mask=gm, other=0).to(tl.float32)
        db = iq2_scale(d, (sc >> (4 * ((g // 2) % 2))[None, :]) & 15)
        for m in tl.static_range(M):
            x_at = x_ptr + m * stride_xm + g[:, None] * 8 + ie[None, :]
            xv = tl.load(x_at, mask=g[:, None] < hi, other=0).to(tl.float32)
            acc = add_to_row(acc, tl.sum(db * tl.sum(w * xv[None, :, :], 2), 1), m, M_PAD)
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym,
               M, M_PAD, b_ptr, HAS_BIAS, SPLIT_K)  # fmt: skip


@triton.jit
def iq2_s_matvec_kernel(
    x_ptr, y_ptr, out_ptr, lock_ptr, b_ptr, w_ptr, d_ptr, grid_ptr,
    N, K,
    stride_xm, stride_ys, stride_ym, stride_w, stride_d,
    M: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    await_inputs(PDL)
    # Group g (8 elements) of a row is group e = g % 32 of block g // 32, whose 80 plane bytes are
    # qs[32], signs[32], qh[8], scales[8]: grid row qs[e] | (bits 2(e % 4), +1 of qh[e // 4]) << 8,
    # element i negated where bit i of signs[e] is set, scaled as sub-block e // 2 (nibble
    # (e // 2) % 2 of scales[e // 4]) with the block's d.
    NG: tl.constexpr = BLOCK_K // 8
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rc = tl.minimum(rows, N - 1)
    ig = tl.arange(0, NG)
    ie = tl.arange(0, 8)
    lo, hi = split_range(K // 8, NG, SPLIT_K)
    acc = tl.zeros((M_PAD, BLOCK_N), tl.float32)
    for g0 in range(lo, hi, NG):
        g = g0 + ig
        gm = g[None, :] < hi
        base = w_ptr + rc[:, None] * stride_w + (g // 32)[None, :] * 80  # (BLOCK_N, NG)
        e = (g % 32)[None, :]
        low = tl.load(base + e, mask=gm, other=0).to(tl.int32)
        pattern = tl.load(base + 32 + e, mask=gm, other=0).to(tl.int32)
        qh = tl.load(base + 64 + e // 4, mask=gm, other=0).to(tl.int32)
        sc = tl.load(base + 72 + e // 4, mask=gm, other=0).to(tl.int32)
        index = low | (((qh >> (2 * (e % 4))) & 3) << 8)
        w = grid_value(
            grid_ptr, index[:, :, None], pattern[:, :, None], ie[None, None, :]
        )  # (BLOCK_N, NG, 8)
        d = tl.load(d_ptr + rc[:, None] * stride_d + (g // 32)[None, :], mask=gm, other=0).to(tl.float32)
        db = iq2_scale(d, (sc >> (4 * ((e // 2) % 2))) & 15)
        for m in tl.static_range(M):
            x_at = x_ptr + m * stride_xm + g[:, None] * 8 + ie[None, :]
            xv = tl.load(x_at, mask=g[:, None] < hi, other=0).to(tl.float32)
            acc = add_to_row(acc, tl.sum(db * tl.sum(w * xv[None, :, :], 2), 1), m, M_PAD)
    store_rows(y_ptr, out_ptr, lock_ptr, acc, rows, N, stride_ys, stride_ym,
               M, M_PAD, b_ptr, HAS_BIAS, SPLIT_K)  # fmt: skip
