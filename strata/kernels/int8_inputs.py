"""x quantized to int8 for the dp4a matvecs, host side: which weights take it (`int8_order`), the
launch (`quantize_x`), and quantizations made ahead (by a norm) and attached to x for its matvecs to
find (`attach_int8`, `attached_int8`). The kernel is `_int8_x.quantize_x_kernel`."""

from __future__ import annotations

import os

import torch
import triton
from gguf.constants import GGMLQuantizationType

from strata import env
from strata.kernels._int8_x import Int8X, empty_int8_x, quantize_x_kernel
from strata.kernels.pdl import launch_args
from strata.kernels.quant_pack import PackedQuantWeight

_T = GGMLQuantizationType
# Types with an int8-x (dp4a) kernel besides Q4_K's planar layout (STRATA_INT8_X picks them; Q6_K by default).
INT8_TYPES = (_T.Q6_K, _T.Q8_0, _T.Q5_0)
# quantize_x_kernel's ACT for each gated activation.
ACTS = {"silu": 1, "gelu_tanh": 2}


def int8_order(w: PackedQuantWeight) -> bool | None:
    """The order in which the matvec quantizes 16-bit x for `w` (True: Q4_K's planar order, False:
    element order), or None where it multiplies 16-bit x as it is: int8 for the types STRATA_INT8_X
    names (by default Q4_K, planar and rows layouts only, and Q6_K)."""
    planar = w.planar
    if (planar or w.qtype in INT8_TYPES) and w.qtype.name in env.int8_x_types():
        return planar
    return None


def attach_int8(x: torch.Tensor, quantized: dict[bool, Int8X]) -> torch.Tensor:
    """Record on the tensor object x its int8 quantizations (by order, made from x as it is now) for
    `attached_int8`; returns x. A later in-place change of x voids them where torch counts x's
    versions (not in inference mode: there the one writer of x, its norm, and its readers, the
    projections, change nothing in place in between)."""
    x._strata_int8 = (_version(x), quantized)  # type: ignore[attr-defined]
    return x


def attached_int8(x: torch.Tensor) -> dict[bool, Int8X] | None:
    """x's quantizations from `attach_int8`, if x is unchanged since (the same tensor object only: a
    view or reshape of x has none)."""
    found = getattr(x, "_strata_int8", None)
    return found[1] if found is not None and found[0] == _version(x) else None


def _version(x: torch.Tensor) -> int | None:
    # An inference-mode tensor counts no versions (reading one raises: asked first, as the exception
    # costs about 7 us a call, on every matvec of an eager decode step).
    return None if x.is_inference() else x._version


def use_asm(t: torch.Tensor) -> bool:
    """Whether kernels on t's device run inline PTX (not in Triton's interpreter, which has twins)."""
    return t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"


def quantize_x(
    x: torch.Tensor, planar: bool = True, up: torch.Tensor | None = None, act: str = "silu"
) -> Int8X:
    """(M, K) x -> per 32-element sub-block: int8 values packed four to a word as the int8 matvecs
    read them, (M, K / 4) int32 (in Q4_K planar order, or with `planar` off in element order), their
    scale max|x| / 127 and the fp32 sum of x, both (M, K / 32). With `up`, the row quantized is
    act(x) * up (see quant_matvec), computed in the same launch."""
    m, subs = x.shape[0], x.shape[1] // 32
    xq, xd, xs = empty_int8_x(m, subs, x.device)
    # No FMA contraction: x * (127 / max) + 0.5 must round twice, as the interpreter and tests do.
    grid = (m, triton.cdiv(subs, 32))
    gate_up = x if up is None else up  # without `up` the kernel never reads it
    quantize_x_kernel[grid](
        x, gate_up, xq, xd, xs, x.shape[1], x.stride(0), gate_up.stride(0),
        NSB=32, PLANAR=planar, ACT=0 if up is None else ACTS[act], USE_ASM=use_asm(x),
        enable_fp_fusion=False,
        **launch_args(x.device),
    )  # fmt: skip
    return xq, xd, xs
