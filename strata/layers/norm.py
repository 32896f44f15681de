"""RMSNorm over the last dimension, computed in float32 whatever the activation dtype."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from strata import env
from strata.gguf.reader import GGUFFile
from strata.quant import dequantize

if TYPE_CHECKING:
    from strata.layers.linear import Projections, QuantLinear


class RMSNorm(nn.Module):
    """x / rms(x) * w. GGUF stores Gemma's (1 + w) already folded into w, so one formula serves all."""

    def __init__(self, weight: torch.Tensor, eps: float, fused: bool = False) -> None:
        """`weight` (hidden,) float; `fused`: run the Triton kernels (the GPU's kernel path)."""
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.eps, self.fused = eps, fused
        # The int8 orders its consumers read (see `quantize_for`); () quantizes nothing here.
        self.int8_orders: tuple[bool, ...] = ()

    @classmethod
    def load(cls, gguf: GGUFFile, name: str, eps: float, fused: bool = False) -> RMSNorm:
        """The norm `name` of the file (its `name.weight`)."""
        info = gguf.tensor_info(f"{name}.weight")
        return cls(dequantize(gguf.tensor_bytes(info.name), info.qtype, info.shape), eps, fused)

    def quantize_for(self, consumers: Projections | QuantLinear) -> None:
        """With STRATA_QUANT_IN_NORM=1 on the kernel path, the decode-sized outputs of `add_and_norm`
        come with their int8 quantizations for `consumers` (the projections this norm feeds, or one
        layer: the output head), made in the norm's launch and found by their matvecs
        (`int8_inputs.attached_int8`)."""
        if self.fused and env.quant_in_norm():
            self.int8_orders = consumers.int8_orders()
            self.matvec_rows = env.kernel_row_limits()[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            from strata.kernels.rms_norm import rms_norm  # needs triton

            return rms_norm(x, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight).to(x.dtype)

    def add_and_norm(
        self, delta: torch.Tensor | None, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + delta), residual + delta): a residual add and the norm after it, in one
        pass on the kernel path (which updates `residual` in place and returns it, or, quantizing for
        int8 projections, returns a new tensor). No delta: no add."""
        if delta is None:
            return self.normed(residual), residual
        if self.fused and self.int8_orders and self._quantizes(delta):
            from strata.kernels.int8_inputs import attach_int8
            from strata.kernels.rms_norm_int8 import rms_norm_int8

            h, summed, int8 = rms_norm_int8(delta, self.weight, self.eps, self.int8_orders, residual=residual)
            assert summed is not None
            return attach_int8(h, int8), summed  # the new residual: written out of place
        if self.fused:
            from strata.kernels.rms_norm import rms_norm

            return rms_norm(delta, self.weight, self.eps, residual=residual), residual
        summed = residual + delta
        return self(summed), summed

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        """norm(x), and on decode rows for int8 projections (`quantize_for`) with its int8
        quantizations attached, made in the norm's launch."""
        if self.fused and self.int8_orders and self._quantizes(x):
            from strata.kernels.int8_inputs import attach_int8
            from strata.kernels.rms_norm_int8 import rms_norm_int8

            h, _, int8 = rms_norm_int8(x, self.weight, self.eps, self.int8_orders)
            return attach_int8(h, int8)
        return self(x)

    def _quantizes(self, x: torch.Tensor) -> bool:
        """Whether x's norm is one the int8 matvecs read: decode rows that `rms_norm_int8` takes."""
        from strata.kernels.rms_norm_int8 import takes

        return takes(x) and x.shape[0] <= self.matvec_rows
