"""How the fp32-x matvecs load x: as it is, or as a gated activation.

A matvec that computes what another launch would have written before it saves that launch and its
round trip through memory. The loader rounds to x's dtype exactly where the launch it replaces
stores, so the products see the same values: with GATED, x is a gate and the value is silu(x) * up,
as `activation.silu_mul` stores it (silu has no multiply-add to contract: the same bits under the
matvec's FMA contraction as under that kernel's launch without it).
"""

import triton
import triton.language as tl

from strata.kernels.activation import gated_value


@triton.jit
def load_x(x_ptr, up_ptr, offsets, mask, GATED: tl.constexpr):
    """x at `offsets` as float32: with GATED silu(x) * up, rounded to x's dtype as the launch it
    replaces stores it."""
    xv = tl.load(x_ptr + offsets, mask=mask, other=0)
    if GATED:
        u = tl.load(up_ptr + offsets, mask=mask, other=0)
        xv = gated_value(xv.to(tl.float32), u.to(tl.float32), False).to(x_ptr.dtype.element_ty)
    return xv.to(tl.float32)
