"""RMSNorm over the last dimension, optionally fused with the residual add before it.

`rms_norm(x, w, eps)` is strata.layers.norm.RMSNorm's formula, x / rms(x) * w in fp32, rounded to
x's dtype. With `residual` it is vLLM's fused_add_rms_norm: residual += x in place (rounded to the
dtype, as torch's `residual + x`), then the norm of the updated residual, so that a block's
`x = x + attn_out; h = norm(x)` reads and writes each row once. One program per row; a row wider
than one tile is read twice (sum of squares, then normalize). `strata.kernels.rms_norm_int8` adds
the int8 quantization of decode rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.pdl import await_inputs, launch_args

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_BLOCK = 8192


@triton.jit
def inverse_rms(sum_of_squares, H, eps):
    """1 / rms of a row of H values from their fp32 sum of squares: the norm's one formula, which
    `rms_norm_int8` shares."""
    return tl.math.rsqrt(sum_of_squares / H + eps)


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
):  # fmt: skip
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
        inv_rms = inverse_rms(tl.sum(v * v, 0), H, eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(o_row + cols, (v * inv_rms * w).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros((BLOCK,), tl.float32)
        for start in range(0, H, BLOCK):
            mask = start + cols < H
            v = _load_row(x_row + start, r_row + start, cols, mask, HAS_RESIDUAL)
            acc += v * v
        inv_rms = inverse_rms(tl.sum(acc, 0), H, eps)
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


def check_inputs(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None) -> None:
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
    check_inputs(x, weight, eps, residual)
    hidden = x.shape[-1]
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        _check_like("out", out, x)
    if block is None:
        block = min(triton.next_power_of_2(hidden), _MAX_BLOCK)
    elif block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    if x.numel() == 0:
        return out

    # A 2-D x is (rows, 1, H): every row is an `outer` index.
    x3, o3 = (x, out) if x.dim() == 3 else (x[:, None], out[:, None])
    r3 = x3 if residual is None else (residual if residual.dim() == 3 else residual[:, None])
    num_rows = x3.shape[0] * x3.shape[1]
    _rms_norm_kernel[(num_rows,)](
        x3, r3, weight, o3,
        hidden, x3.shape[1], float(eps),
        x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1), o3.stride(0), o3.stride(1),
        BLOCK=block, ONE_TILE=block >= hidden, HAS_RESIDUAL=residual is not None,
        num_warps=warps_for(block),
        **launch_args(x.device),
    )  # fmt: skip
    return out


def warps_for(block: int) -> int:
    """The warps of a norm program over `block` columns (its sum of squares' reduction order)."""
    return min(8, max(1, block // 256))
