"""Rotary embedding of Q and K fused with the KV-cache write.

One program per (token, head) over q's heads then k's: a q head is rotated in place; a KV head's
rotated K and its V are stored at the token's cache slot. The rotation is
strata.layers.rotary.RotaryEmbedding's: angle = (position / scale) * inv_freq in fp32, channel pairs
(i, i + rope_dim/2) for "neox" or (2i, 2i + 1) for "interleaved", channels past rope_dim unchanged,
results rounded to the input's dtype (K then again to the cache's, as rotating then
KVCache.write would round it).
"""

from __future__ import annotations

from typing import Literal

import torch
import triton
import triton.language as tl

from strata.kernels.pdl import await_inputs, launch_args

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)


@triton.jit
def rope_channels(d, ROPE_DIM: tl.constexpr, INTERLEAVED: tl.constexpr):
    """For channels d of a head, laid out whole (not as pairs): (rotated, partner, freq, sign) —
    whether d is rotated, the other channel of its pair, its pair's inv_freq index, and -1 on a
    pair's first channel, +1 on its second (see `rope_rotate`)."""
    rotated = d < ROPE_DIM
    if INTERLEAVED:
        first = d % 2 == 0
        partner = d ^ 1
        freq = d // 2
    else:
        first = d < ROPE_DIM // 2
        partner = tl.where(first, d + ROPE_DIM // 2, d - ROPE_DIM // 2)
        freq = tl.where(first, d, d - ROPE_DIM // 2)
    return rotated, partner, freq, tl.where(first, -1.0, 1.0)


@triton.jit
def rope_cos_sin(positions_ptr, t, inv_freq_ptr, scale, freq, rotated):
    """cos and sin of token t's angles at inv_freq[freq] (masked by `rotated`), in fp32."""
    # Division rounded to nearest (plain `/` is approximate on the GPU), as torch computes it.
    pos = tl.math.div_rn(tl.load(positions_ptr + t).to(tl.float32), scale)
    angle = pos * tl.load(inv_freq_ptr + freq, mask=rotated, other=0.0)
    return tl.cos(angle), tl.sin(angle)


@triton.jit
def rope_rotate(x, x_partner, sign, cos, sin, rotated):
    """x rotated channel by channel (fp32): x * cos - partner * sin on a pair's first channel, x * cos
    + partner * sin on its second, x past rope_dim; each an explicit fused multiply-add of the rounded
    partner product (the sign multiplies exactly). Left to the compiler, which product an FMA takes
    is chosen per kernel: the rotary kernel and a matvec's store that rotates computed values an fp32
    ulp apart on an H100. Spelled out, every kernel and the interpreter round alike."""
    return tl.where(rotated, tl.fma(x, cos, (sign * x_partner) * sin), x)


@triton.jit
def rope_pair(x1, x2, cos, sin):
    """A pair's two channels rotated (`rope_rotate` of each with the other as its partner)."""
    return rope_rotate(x1, x2, -1.0, cos, sin, True), rope_rotate(x2, x1, 1.0, cos, sin, True)


@triton.jit
def _rotary_kv_kernel(
    q_ptr, k_ptr, v_ptr, positions_ptr, inv_freq_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    scale,
    stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_kcs, stride_kch, stride_kcd, stride_vcs, stride_vch, stride_vcd,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, ROPE_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr, DIM_PAD: tl.constexpr, INTERLEAVED: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    await_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    i = tl.arange(0, HALF_PAD)
    pair = i < ROPE_DIM // 2
    if INTERLEAVED:
        c1 = 2 * i
        c2 = 2 * i + 1
    else:
        c1 = i
        c2 = i + ROPE_DIM // 2
    cos, sin = rope_cos_sin(positions_ptr, t, inv_freq_ptr, scale, i, pair)

    if head < NUM_Q_HEADS:
        row = q_ptr + t * stride_qt + head * stride_qh
        x1 = tl.load(row + c1 * stride_qd, mask=pair).to(tl.float32)
        x2 = tl.load(row + c2 * stride_qd, mask=pair).to(tl.float32)
        y1, y2 = rope_pair(x1, x2, cos, sin)
        tl.store(row + c1 * stride_qd, y1.to(q_ptr.dtype.element_ty), mask=pair)
        tl.store(row + c2 * stride_qd, y2.to(q_ptr.dtype.element_ty), mask=pair)
    else:
        kvh = head - NUM_Q_HEADS
        slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
        # A negative slot (a padding token of a captured batch) writes nothing.
        if slot >= 0:
            k_row = k_ptr + t * stride_kt + kvh * stride_kh
            kc_row = k_cache_ptr + slot * stride_kcs + kvh * stride_kch
            x1 = tl.load(k_row + c1 * stride_kd, mask=pair).to(tl.float32)
            x2 = tl.load(k_row + c2 * stride_kd, mask=pair).to(tl.float32)
            y1, y2 = rope_pair(x1, x2, cos, sin)
            y1 = y1.to(k_ptr.dtype.element_ty).to(k_cache_ptr.dtype.element_ty)
            y2 = y2.to(k_ptr.dtype.element_ty).to(k_cache_ptr.dtype.element_ty)
            tl.store(kc_row + c1 * stride_kcd, y1, mask=pair)
            tl.store(kc_row + c2 * stride_kcd, y2, mask=pair)

            d = tl.arange(0, DIM_PAD)
            if ROPE_DIM < HEAD_DIM:
                rest = (d >= ROPE_DIM) & (d < HEAD_DIM)
                k_rest = tl.load(k_row + d * stride_kd, mask=rest)
                tl.store(kc_row + d * stride_kcd, k_rest.to(k_cache_ptr.dtype.element_ty), mask=rest)
            dm = d < HEAD_DIM
            v = tl.load(v_ptr + t * stride_vt + kvh * stride_vh + d * stride_vd, mask=dm)
            vc_row = v_cache_ptr + slot * stride_vcs + kvh * stride_vch
            tl.store(vc_row + d * stride_vcd, v.to(v_cache_ptr.dtype.element_ty), mask=dm)


def _check(
    name: str, t: torch.Tensor, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...], q: torch.Tensor
) -> None:
    # -1 in `shape` matches any size.
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must be one of {', '.join(map(str, dtypes))}; got {t.dtype}")
    if t.dim() != len(shape) or any(n not in (-1, m) for n, m in zip(shape, t.shape, strict=True)):
        want = ", ".join("any" if n == -1 else str(n) for n in shape)
        raise ValueError(f"{name} must be ({want}); got {tuple(t.shape)}")
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device} but q is on {q.device}")


def rotary_kv_write(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    rope_dim: int,
    layout: Literal["neox", "interleaved"],
    scale: float = 1.0,
) -> None:
    """Rotates q in place and writes rotated k and v to the caches at `slot_mapping`.

    q: (tokens, heads, head_dim); k, v: (tokens, kv_heads, head_dim); any strides (views of a fused
    QKV output work as they are), fp32/fp16/bf16. positions: (tokens,) int32/int64; inv_freq:
    (rope_dim/2,) fp32 (RotaryEmbedding.inv_freq); k_cache, v_cache: (num_slots, kv_heads, head_dim)
    in any of the three float dtypes (values are cast on store), e.g. `kv[layer, 0]` and
    `kv[layer, 1]` of a KVCache; slot_mapping: (tokens,) int32/int64, where a negative slot writes
    nothing (padding). `layout` is "neox" or "interleaved"; `scale` divides positions (linear RoPE
    scaling). No host-device sync: safe to capture in a CUDA graph.
    """
    _check("q", q, (-1, -1, -1), _DTYPES, q)
    num_tokens, num_heads, head_dim = q.shape
    _check("k", k, (num_tokens, -1, head_dim), _DTYPES, q)
    num_kv_heads = k.shape[1]
    _check("v", v, (num_tokens, num_kv_heads, head_dim), _DTYPES, q)
    _check("k_cache", k_cache, (-1, num_kv_heads, head_dim), _DTYPES, q)
    _check("v_cache", v_cache, (k_cache.shape[0], num_kv_heads, head_dim), _DTYPES, q)
    _check("positions", positions, (num_tokens,), _INDEX_DTYPES, q)
    _check("slot_mapping", slot_mapping, (num_tokens,), _INDEX_DTYPES, q)
    if rope_dim < 2 or rope_dim % 2 or rope_dim > head_dim:
        raise ValueError(f"rope_dim must be even and in [2, head_dim={head_dim}], got {rope_dim}")
    _check("inv_freq", inv_freq, (rope_dim // 2,), (torch.float32,), q)
    if layout not in ("neox", "interleaved"):
        raise ValueError(f'layout must be "neox" or "interleaved", got {layout!r}')
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if num_tokens == 0:
        return

    _rotary_kv_kernel[(num_tokens, num_heads + num_kv_heads)](
        q, k, v, positions, inv_freq, k_cache, v_cache, slot_mapping,
        float(scale),
        *q.stride(), *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
        NUM_Q_HEADS=num_heads, HEAD_DIM=head_dim, ROPE_DIM=rope_dim,
        HALF_PAD=triton.next_power_of_2(rope_dim // 2), DIM_PAD=triton.next_power_of_2(head_dim),
        INTERLEAVED=layout == "interleaved", num_warps=1 if head_dim <= 128 else 2,
        **launch_args(q.device),
    )  # fmt: skip
