"""Gated MLP activations: act(gate) * up in fp32, stored in gate's dtype, in one pass.

gate and up may be the two column halves of one fused (tokens, 2 * F) projection; each program
handles BLOCK columns of one row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.pdl import await_inputs, launch_args

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def gated_value(g, u, GELU: tl.constexpr):
    """act(g) * u in float32 for float32 g, u: silu, or gelu_tanh with GELU. Callers launch without FMA
    contraction, so that every kernel computing it (this module's, `_int8_x`'s) rounds alike."""
    if GELU:
        # 0.5 * g * (1 + tanh(z)) == g * sigmoid(2z), z = sqrt(2/pi) * (g + 0.044715 g^3); the sigmoid
        # form has no cancellation for g << 0 and needs no tanh (not in Triton's stable tl API).
        # 1.5957691216057308 is 2 * sqrt(2 / pi).
        z2 = 1.5957691216057308 * (g + 0.044715 * g * g * g)
        act = g / (1.0 + tl.exp(-z2))
    else:
        act = g / (1.0 + tl.exp(-g))
    return act * u


@triton.jit
def _gated_act_kernel(
    gate_ptr, up_ptr, out_ptr,
    F,
    stride_gt, stride_gf, stride_ut, stride_uf, stride_ot, stride_of,
    BLOCK: tl.constexpr, GELU: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    await_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)  # int64: t * stride can pass 2**31 in a long prefill
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    g = tl.load(gate_ptr + t * stride_gt + cols * stride_gf, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + t * stride_ut + cols * stride_uf, mask=mask, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + t * stride_ot + cols * stride_of,
        gated_value(g, u, GELU).to(out_ptr.dtype.element_ty),
        mask=mask,
    )


def _gated(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None, gelu: bool) -> torch.Tensor:
    for name, t in (("gate", gate), ("up", up), ("out", out)):
        if t is not None and t.dtype not in _DTYPES:
            raise TypeError(f"{name} must be fp32, fp16 or bf16, got {t.dtype}")
    if gate.dim() != 2:
        raise ValueError(f"gate must be (tokens, F), got {tuple(gate.shape)}")
    if up.shape != gate.shape or up.device != gate.device:
        raise ValueError(
            f"up must be {tuple(gate.shape)} on {gate.device} like gate; got {tuple(up.shape)} on {up.device}"
        )
    if out is None:
        out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    elif out.dtype != gate.dtype:
        raise TypeError(f"out must have gate's dtype {gate.dtype}, got {out.dtype}")
    elif out.shape != gate.shape or out.device != gate.device:
        raise ValueError(
            f"out must be {tuple(gate.shape)} on {gate.device} like gate; "
            f"got {tuple(out.shape)} on {out.device}"
        )
    num_tokens, width = gate.shape
    if out.numel() == 0:
        return out
    block = min(1024, triton.next_power_of_2(width))
    _gated_act_kernel[(num_tokens, triton.cdiv(width, block))](
        gate, up, out, width, *gate.stride(), *up.stride(), *out.stride(),
        BLOCK=block, GELU=gelu, num_warps=4 if block >= 512 else 1, enable_fp_fusion=False,
        **launch_args(gate.device),
    )  # fmt: skip
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """F.silu(gate) * up in fp32, in gate's dtype (SwiGLU: Llama, Qwen). gate, up: (tokens, F), any
    strides (e.g. the halves of one (tokens, 2F) tensor); returns `out`, allocated if None."""
    return _gated(gate, up, out, gelu=False)


def gated_act(gate: torch.Tensor, up: torch.Tensor, kind: str) -> torch.Tensor:
    """silu_mul (kind "silu") or gelu_tanh_mul (kind "gelu_tanh") of gate and up, in gate's dtype."""
    return silu_mul(gate, up) if kind == "silu" else gelu_tanh_mul(gate, up)


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """F.gelu(gate, approximate="tanh") * up in fp32, in gate's dtype (GeGLU: Gemma); as silu_mul."""
    return _gated(gate, up, out, gelu=True)
