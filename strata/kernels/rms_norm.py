"""RMSNorm over the last dimension, optionally fused with the residual add before it.

`rms_norm(x, w, eps)` is strata.layers.norm.RMSNorm's formula, x / rms(x) * w in fp32, rounded to
x's dtype. With `residual` it is vLLM's fused_add_rms_norm: residual += x in place (rounded to the
dtype, as torch's `residual + x`), then the norm of the updated residual, so that a block's
`x = x + attn_out; h = norm(x)` reads and writes each row once. One program per row; a row wider
than one tile is read twice (sum of squares, then normalize). `rms_norm_int8` also quantizes each
output row for the int8 matvecs, in the same launch (what `quant_matvec.quantize_x` would write).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels._int8_x import Int8X, store_int8
from strata.kernels.pdl import await_inputs, launch_args

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_BLOCK = 8192


@triton.jit
def _load_row(x_row, r_row, cols, mask, HAS_RESIDUAL: tl.constexpr):
    v = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        v = v + tl.load(r_row + cols, mask=mask, other=0.0).to(tl.float32)
        # Rounded as torch's `residual + x` is, so the norm sees the residual it leaves behind.
        v = v.to(r_row.dtype.element_ty).to(tl.float32)
    return v


@triton.jit
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr,
    H, inner, eps,
    stride_x0, stride_x1, stride_r0, stride_r1, stride_o0, stride_o1,
    BLOCK: tl.constexpr, ONE_TILE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    PDL: tl.constexpr = False,
    qp_ptr=None, dp_ptr=None, sp_ptr=None, qe_ptr=None, de_ptr=None, se_ptr=None,
    INT8: tl.constexpr = 0,
):  # fmt: skip
    """INT8 (one tile, 2-D x): bit 1 quantizes each output row to int8 in Q4_K's planar order into
    qp/dp/sp, bit 2 in element order into qe/de/se (`store_int8`, from the rounded output)."""
    await_inputs(PDL)
    # Rows are (outer, inner) pairs so that a (tokens, heads, head_dim) view need not be contiguous.
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride can pass 2**31
    outer = row // inner
    rin = row % inner
    x_row = x_ptr + outer * stride_x0 + rin * stride_x1
    r_row = r_ptr + outer * stride_r0 + rin * stride_r1
    o_row = out_ptr + outer * stride_o0 + rin * stride_o1
    cols = tl.arange(0, BLOCK)
    if ONE_TILE:
        mask = cols < H
        v = _load_row(x_row, r_row, cols, mask, HAS_RESIDUAL)
        if HAS_RESIDUAL:
            tl.store(r_row + cols, v.to(r_ptr.dtype.element_ty), mask=mask)
        inv_rms = tl.math.rsqrt(tl.sum(v * v, 0) / H + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        h = (v * inv_rms * w).to(out_ptr.dtype.element_ty)
        tl.store(o_row + cols, h, mask=mask)
        if INT8 != 0:
            NSB: tl.constexpr = BLOCK // 32
            n_sub = H // 32
            h = tl.reshape(h.to(tl.float32), (NSB, 32))
            s = tl.arange(0, NSB)
            words, subs = row * n_sub * 8, row * n_sub
            if INT8 & 1:
                store_int8(h, s, s < n_sub, qp_ptr + words, dp_ptr + subs, sp_ptr + subs, NSB, True)
            if INT8 & 2:
                store_int8(h, s, s < n_sub, qe_ptr + words, de_ptr + subs, se_ptr + subs, NSB, False)
    else:
        acc = tl.zeros((BLOCK,), tl.float32)
        for start in range(0, H, BLOCK):
            mask = start + cols < H
            v = _load_row(x_row + start, r_row + start, cols, mask, HAS_RESIDUAL)
            acc += v * v
        inv_rms = tl.math.rsqrt(tl.sum(acc, 0) / H + eps)
        # The second pass recomputes x + residual from the inputs instead of reading back what this
        # program stored, so it never depends on one thread seeing another thread's store.
        for start in range(0, H, BLOCK):
            mask = start + cols < H
            v = _load_row(x_row + start, r_row + start, cols, mask, HAS_RESIDUAL)
            if HAS_RESIDUAL:
                tl.store(r_row + start + cols, v.to(r_ptr.dtype.element_ty), mask=mask)
            w = tl.load(w_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(o_row + start + cols, (v * inv_rms * w).to(out_ptr.dtype.element_ty), mask=mask)


def _check_like(name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    if t.dtype != x.dtype:
        raise TypeError(f"{name} must have x's dtype {x.dtype}, got {t.dtype}")
    if t.shape != x.shape or t.device != x.device or t.stride(-1) != 1:
        raise ValueError(
            f"{name} must be {tuple(x.shape)} on {x.device} with a contiguous last dim, like x; "
            f"got {tuple(t.shape)} on {t.device} with strides {t.stride()}"
        )


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """x / rms(x) * weight over the last dim in fp32, in x's dtype; returns `out` (allocated if None).

    x: (rows, H) or (tokens, heads, H) in fp32/fp16/bf16, any strides but a contiguous last dim (a
    head view of a fused QKV output works as is); weight: (H,) float. With `residual` (x's shape and
    dtype) the residual is updated in place to residual + x first and the result is the norm of
    that. `out` may be x itself. `block` is the tile width (a power of two; default H rounded up to
    one, at most 8192); rows wider than a tile are looped over. No host-device sync: safe to capture
    in a CUDA graph.
    """
    return _launch(x, weight, eps, residual, out, block, ())[0]


def rms_norm_int8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    orders: tuple[bool, ...],
    *,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[bool, Int8X]]:
    """`rms_norm` of a 16-bit (rows, H) x, H a multiple of 32 and at most 8,192, and its rows quantized
    for the int8 matvecs in the same launch: for each of `orders` (True: Q4_K's planar order, False:
    element order) the (words, dx, sums) that `quant_matvec.quantize_x(out, planar)` returns, bit for
    bit (the quantization reads the rounded output)."""
    if x.dim() != 2 or x.dtype == torch.float32 or x.shape[-1] % 32 or x.shape[-1] > _MAX_BLOCK:
        raise ValueError(
            f"rms_norm_int8 takes a 16-bit (rows, H) x with H a multiple of 32 up to {_MAX_BLOCK}; got "
            f"{tuple(x.shape)} {x.dtype} (use rms_norm, then quantize_x)"
        )
    return _launch(x, weight, eps, residual, None, None, orders)


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    out: torch.Tensor | None,
    block: int | None,
    orders: tuple[bool, ...],
) -> tuple[torch.Tensor, dict[bool, Int8X]]:
    if x.dtype not in _DTYPES:
        raise TypeError(f"x must be fp32, fp16 or bf16, got {x.dtype}")
    if x.dim() not in (2, 3) or x.stride(-1) != 1:
        raise ValueError(
            f"x must be (rows, H) or (tokens, heads, H) with a contiguous last dim; "
            f"got {tuple(x.shape)} with strides {x.stride()}"
        )
    hidden = x.shape[-1]
    if not weight.is_floating_point():
        raise TypeError(f"weight must be a float tensor, got {weight.dtype}")
    if weight.shape != (hidden,) or weight.stride(0) != 1 or weight.device != x.device:
        raise ValueError(
            f"weight must be a contiguous ({hidden},) on {x.device} to match x's last dim; got "
            f"{tuple(weight.shape)} on {weight.device}"
        )
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if residual is not None:
        _check_like("residual", residual, x)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        _check_like("out", out, x)
    if block is None:
        block = min(triton.next_power_of_2(hidden), _MAX_BLOCK)
    elif block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    rows, subs = x.numel() // max(hidden, 1), hidden // 32
    int8 = {
        planar: (
            torch.empty(rows, subs * 8, dtype=torch.int32, device=x.device),
            torch.empty(rows, subs, dtype=torch.float32, device=x.device),
            torch.empty(rows, subs, dtype=torch.float32, device=x.device),
        )
        for planar in orders
    }
    if x.numel() == 0:
        return out, int8

    # A 2-D x is (rows, 1, H): every row is an `outer` index.
    x3, o3 = (x, out) if x.dim() == 3 else (x[:, None], out[:, None])
    r3 = x3 if residual is None else (residual if residual.dim() == 3 else residual[:, None])
    num_rows = x3.shape[0] * x3.shape[1]
    _rms_norm_kernel[(num_rows,)](
        x3, r3, weight, o3,
        hidden, x3.shape[1], float(eps),
        x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1), o3.stride(0), o3.stride(1),
        BLOCK=block, ONE_TILE=block >= hidden, HAS_RESIDUAL=residual is not None,
        num_warps=min(8, max(1, block // 256)),
        **dict(zip(("qp_ptr", "dp_ptr", "sp_ptr"), int8.get(True, (out,) * 3), strict=True)),
        **dict(zip(("qe_ptr", "de_ptr", "se_ptr"), int8.get(False, (out,) * 3), strict=True)),
        INT8=(True in int8) + 2 * (False in int8),
        **launch_args(x.device),
    )  # fmt: skip
    return out, int8
