"""`QuantLinear`: a linear layer whose weight comes from a GGUF tensor of any quant type."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from strata.gguf.reader import GGUFFile
from strata.quant import dequantize


class QuantLinear(nn.Module):
    """y = x W^T + b, W read from GGUF bytes.

    The CPU reference dequantizes W once, at build time, into the compute dtype; the per-token cost is
    then a dense matmul. The quantized bytes stay on the module (`qweight`, a view of the mapped file)
    so fused dequant kernels can take over without reloading.
    """

    def __init__(self, gguf: GGUFFile, name: str, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        info = gguf.tensor_info(f"{name}.weight")
        self.qtype = info.qtype
        self.out_features, self.in_features = info.shape
        self.qweight = gguf.tensor_bytes(info.name)
        self.weight = nn.Parameter(
            dequantize(self.qweight, info.qtype, info.shape).to(dtype), requires_grad=False
        )
        bias_name = f"{name}.bias"
        self.bias: nn.Parameter | None = None
        if bias_name in gguf.tensors:
            b = gguf.tensor_info(bias_name)
            self.bias = nn.Parameter(dequantize(gguf.tensor_bytes(b.name), b.qtype, b.shape).to(dtype), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.qtype.name}, bias={self.bias is not None}"
