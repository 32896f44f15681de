"""The merge of split-K paged decode attention (`paged_attention`): a head's partials merged by
log-sum-exp into its output, by a second kernel (which can also quantize the output for the o
projection's int8 matvec: `merge_quantization`); and `_live_splits`, the rule the split and merge
kernels both apply for how many of the splits a context fills."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels._int8_x import Int8X, empty_int8_x, store_int8
from strata.kernels.int8_inputs import use_asm
from strata.kernels.pdl import await_inputs


def merge_quantization(out: torch.Tensor, order: bool | None) -> tuple[dict, Int8X | None]:
    """The merge kernel's arguments that make it quantize `out` (batch, heads, head_dim) for an int8
    matvec reading its rows in `order` (`int8_inputs.int8_order`), and the buffers it fills in
    `quantize_x`'s layout; nothing where `order` is None or the head dim is not a power of two of 32
    or more (a head's sub-blocks are then not the program's own)."""
    batch, heads, dim = out.shape
    if order is None or dim < 32 or dim & (dim - 1):
        return {}, None
    xq, xd, xs = int8 = empty_int8_x(batch, heads * dim // 32, out.device)
    quant = dict(xq_ptr=xq, xd_ptr=xd, xs_ptr=xs, QUANT=True, PLANAR=order, USE_ASM=use_asm(out))
    return quant, int8


@triton.jit
def _live_splits(ctx, window, num_splits, min_split_len, HAS_WINDOW: tl.constexpr):
    """(lo, n): the context's first attended position and how many of the `num_splits` splits it
    uses: cdiv(positions, min_split_len), at least one (the chunks, whole tiles, may be shorter)."""
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(ctx - window, 0)
    return lo, tl.minimum(num_splits, tl.maximum(tl.cdiv(ctx - lo, min_split_len), 1))


@triton.jit
def _merge_kernel(
    out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, context_lens_ptr,
    window, num_splits, min_split_len, stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, S_PAD: tl.constexpr,
    HAS_WINDOW: tl.constexpr, MERGE_CHUNK: tl.constexpr = 64,
    PDL: tl.constexpr = False,
    xq_ptr=None, xd_ptr=None, xs_ptr=None, QUANT: tl.constexpr = False, PLANAR: tl.constexpr = True,
    USE_ASM: tl.constexpr = False,
):  # fmt: skip
    """QUANT (STRATA_QUANT_IN_MERGE): the program also quantizes head h's output, as rounded to out's
    dtype, for the int8 matvec of the o projection (`_int8_x.store_int8`, `quantize_x`'s layout for
    rows of NUM_HEADS * D, in Q4_K's planar order or with PLANAR off in element order): merged here,
    or, where one split wrote it itself, read back. D a power of two of 32 and more."""
    await_inputs(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    _, live = _live_splits(tl.load(context_lens_ptr + b), window, num_splits, min_split_len, HAS_WINDOW)
    idim = tl.arange(0, D_PAD)
    out_at = out_ptr + b * stride_ob + h * stride_oh + idim
    out = tl.zeros((D_PAD,), tl.float32)
    if live > 1:  # one split wrote the output itself
        if S_PAD <= MERGE_CHUNK:  # noqa: SIM108 (Triton: constexprs stay so only as plain arguments)
            out = _merge(part_m_ptr, part_l_ptr, part_acc_ptr, b, h, live, num_splits, NUM_HEADS, D_PAD,
                         S_PAD)  # fmt: skip
        else:
            out = _merge_chunks(part_m_ptr, part_l_ptr, part_acc_ptr, b, h, live, num_splits, NUM_HEADS,
                                D_PAD, MERGE_CHUNK)  # fmt: skip
        tl.store(out_at, out.to(out_ptr.dtype.element_ty), mask=idim < D)
    if QUANT:
        written = tl.load(out_at, mask=(idim < D) & (idim * 0 + live == 1), other=0.0)
        x = tl.where(live > 1, out.to(out_ptr.dtype.element_ty), written).to(tl.float32)
        NSUB: tl.constexpr = D // 32
        subs = h * NSUB + tl.arange(0, NSUB)
        n_sub = NUM_HEADS * NSUB
        store_int8(tl.reshape(x, (NSUB, 32)), subs, subs < n_sub, xq_ptr + b * n_sub * 8, xd_ptr + b * n_sub,
                   xs_ptr + b * n_sub, NSUB, PLANAR, USE_ASM)  # fmt: skip


@triton.jit
def _merge(part_m_ptr, part_l_ptr, part_acc_ptr, b, h, live, num_splits,
           NUM_HEADS: tl.constexpr, D_PAD: tl.constexpr, S_PAD: tl.constexpr):  # fmt: skip
    """Head h of sequence b: its `live` partials merged by log-sum-exp, (D_PAD,) fp32."""
    isp = tl.arange(0, S_PAD)
    idim = tl.arange(0, D_PAD)
    sm = isp < live
    row = (b * NUM_HEADS + h) * num_splits + isp
    m = tl.load(part_m_ptr + row, mask=sm, other=float("-inf"))
    l_s = tl.load(part_l_ptr + row, mask=sm, other=0.0)
    acc = tl.load(part_acc_ptr + row[:, None] * D_PAD + idim[None, :], mask=sm[:, None], other=0.0)
    # out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s; empty chunks have m_s = -inf (weight 0).
    m_max = tl.max(m, 0)
    m_ref = tl.where(m_max > float("-inf"), m_max, 0.0)
    w = tl.exp2(m - m_ref)
    den = tl.sum(w * l_s, 0)
    return tl.sum(acc * w[:, None], 0) / tl.where(den > 0, den, 1.0)


@triton.jit
def _merge_chunks(
    part_m_ptr, part_l_ptr, part_acc_ptr, b, h, live, num_splits,
    NUM_HEADS: tl.constexpr, D_PAD: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """`_merge` over more splits than one (CHUNK, D_PAD) tile holds in registers: the largest running
    max first, then the weighted sums chunk by chunk."""
    idim = tl.arange(0, D_PAD)
    row0 = (b * NUM_HEADS + h) * num_splits
    m_max = float("-inf")
    for s0 in range(0, live, CHUNK):
        isp = s0 + tl.arange(0, CHUNK)
        m = tl.load(part_m_ptr + row0 + isp, mask=isp < live, other=float("-inf"))
        m_max = tl.maximum(m_max, tl.max(m, 0))
    m_ref = tl.where(m_max > float("-inf"), m_max, 0.0)
    den = 0.0
    num = tl.zeros((D_PAD,), tl.float32)
    for s0 in range(0, live, CHUNK):
        isp = s0 + tl.arange(0, CHUNK)
        sm = isp < live
        w = tl.exp2(tl.load(part_m_ptr + row0 + isp, mask=sm, other=float("-inf")) - m_ref)
        den += tl.sum(w * tl.load(part_l_ptr + row0 + isp, mask=sm, other=0.0), 0)
        acc_at = part_acc_ptr + (row0 + isp)[:, None] * D_PAD + idim[None, :]
        acc = tl.load(acc_at, mask=sm[:, None], other=0.0)
        num += tl.sum(acc * w[:, None], 0)
    return num / tl.where(den > 0, den, 1.0)
