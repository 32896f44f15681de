"""How the fp32-x matvecs load x: as it is, as a gated activation, or as the RMSNorm of it.

A matvec that computes what another launch would have written before it saves that launch and its
round trip through memory. Each loader rounds to x's dtype exactly where the launch it replaces
stores, so the products see the same values:

- GATED: x is a gate and the value is silu(x) * up, as `activation.silu_mul` stores it (silu has no
  multiply-add to contract: the same bits under the matvec's FMA contraction as under that kernel's
  launch without it).
- NORMED (one row of x, M = 1): the value is x / rms(x) * w, as `rms_norm.rms_norm` stores it, given
  the row's 1 / rms from `row_inverse_rms`. Every program computes that from the whole row (the
  norm's formula, `rms_norm.inverse_rms`); its sum of squares is reduced in the matvec's thread layout,
  compiled another order than the norm kernel's, so the compiled values can differ from the norm's
  in the last bit of 1 / rms (in Triton's interpreter they agree).
"""

import triton
import triton.language as tl

from strata.kernels.activation import gated_value
from strata.kernels.rms_norm import inverse_rms


@triton.jit
def row_inverse_rms(x_ptr, K, eps, NORMED: tl.constexpr, BLOCK_H: tl.constexpr):
    """1 / rms of x's first row of K values (BLOCK_H >= K, a power of two) with NORMED, else 1."""
    if NORMED:
        cols = tl.arange(0, BLOCK_H)
        v = tl.load(x_ptr + cols, mask=cols < K, other=0).to(tl.float32)
        scale = inverse_rms(tl.sum(v * v, 0), K, eps)
    else:
        scale = 1.0
    return scale


@triton.jit
def load_x(
    x_ptr, up_ptr, offsets, mask, GATED: tl.constexpr,
    norm_ptr=None, inv_rms=1.0, NORMED: tl.constexpr = False,
):  # fmt: skip
    """x at `offsets` as float32: with GATED silu(x) * up, with NORMED (offsets within x's one row)
    x * inv_rms * norm_w, each rounded to x's dtype as the launch it replaces stores it."""
    xv = tl.load(x_ptr + offsets, mask=mask, other=0)
    if GATED:
        u = tl.load(up_ptr + offsets, mask=mask, other=0)
        xv = gated_value(xv.to(tl.float32), u.to(tl.float32), False).to(x_ptr.dtype.element_ty)
    if NORMED:
        w = tl.load(norm_ptr + offsets, mask=mask, other=0).to(tl.float32)
        xv = (xv.to(tl.float32) * inv_rms * w).to(x_ptr.dtype.element_ty)
    return xv.to(tl.float32)
