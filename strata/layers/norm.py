"""RMSNorm over the last dimension, computed in float32 whatever the activation dtype."""

from __future__ import annotations

import torch
from torch import nn

from strata.gguf.reader import GGUFFile
from strata.quant import dequantize


class RMSNorm(nn.Module):
    """x / rms(x) * w. GGUF stores Gemma's (1 + w) already folded into w, so one formula serves all."""

    def __init__(self, gguf: GGUFFile, name: str, eps: float, fused: bool = False) -> None:
        super().__init__()
        info = gguf.tensor_info(f"{name}.weight")
        weight = dequantize(gguf.tensor_bytes(info.name), info.qtype, info.shape)
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.eps, self.fused = eps, fused

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
        pass on the kernel path (which updates `residual` in place and returns it). No delta: no add."""
        if delta is None:
            return self(residual), residual
        if self.fused:
            from strata.kernels.rms_norm import rms_norm

            return rms_norm(delta, self.weight, self.eps, residual=residual), residual
        summed = residual + delta
        return self(summed), summed
