"""The gated activations of feed-forward blocks: act(gate) * up, one kernel on the kernel path."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gated(kind: str, gate: torch.Tensor, up: torch.Tensor, fused: bool) -> torch.Tensor:
    """silu(gate) * up (SwiGLU, kind "silu") or gelu_tanh(gate) * up (GeGLU, kind "gelu_tanh")."""
    if fused:
        from strata.kernels.activation import gated_act  # needs triton

        return gated_act(gate, up, kind)
    if kind == "silu":
        return F.silu(gate) * up
    return F.gelu(gate, approximate="tanh") * up
