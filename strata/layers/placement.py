"""Where and how a model's weights live: the activation dtype, the device, and which code path runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata import env
from strata.parallel.group import SINGLE, TensorParallel


@dataclass(frozen=True)
class Placement:
    """Built once per model and handed to every layer, so each picks its path once, at build time.

    `kernels` is the GPU path: weights stay in their GGUF blocks (packed for the fused kernels) and
    the Triton kernels run; otherwise the torch reference runs on dequantized dense weights. On the
    CPU the kernel path exists only for tests (STRATA_TRITON_ON_CPU with Triton's interpreter).
    `tp`: this process's rank among the ranks that each hold a part of every layer (one rank: all).
    """

    dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")
    kernels: bool = False
    tp: TensorParallel = SINGLE

    @classmethod
    def of(
        cls, dtype: torch.dtype, device: str | torch.device = "cpu", tp: TensorParallel = SINGLE
    ) -> Placement:
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' was asked for, but torch sees no CUDA GPU here; use --device cpu")
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"device {str(device)!r} is not supported; choose cpu or cuda")
        return cls(dtype, device, kernels=device.type == "cuda" or env.triton_on_cpu(), tp=tp)
