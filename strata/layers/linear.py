"""`QuantLinear`: a linear layer whose weight comes from a GGUF tensor of any quant type."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from gguf.constants import GGMLQuantizationType
from torch import nn

from strata.gguf.reader import GGUFFile
from strata.layers.placement import Placement
from strata.quant import dequantize

# strata.kernels needs triton, which a CPU-only install may lack: it is imported only on the kernel path.
if TYPE_CHECKING:
    from strata.kernels.quant_pack import PackedQuantWeight


class QuantLinear(nn.Module):
    """y = x W^T + b, W read from GGUF bytes.

    On the reference path W is dequantized once, at build time, into the compute dtype, and every
    call is a dense matmul. On the kernel path W stays in its GGUF blocks on the device (regrouped
    into aligned planes, the same bytes): up to `MAX_M` rows go through the fused dequant matvec,
    more rows through the fused dequant matmul. Types without a fused kernel keep a dense weight.
    """

    def __init__(
        self,
        qweight: torch.Tensor,
        qtype: GGMLQuantizationType,
        shape: tuple[int, int],
        place: Placement,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.qtype = qtype
        self.out_features, self.in_features = shape
        self.packed: PackedQuantWeight | None = None
        self.weight: nn.Parameter | None = None
        if place.kernels and _has_kernel(qtype):
            from strata.kernels.quant_pack import pack_quant_weight

            self.packed = pack_quant_weight(qweight.to(place.device), qtype, *shape)
        else:
            dense = dequantize(qweight.to(place.device), qtype, shape).to(place.dtype)
            self.weight = nn.Parameter(dense, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.to(place.device, place.dtype), False)

    @classmethod
    def load(cls, gguf: GGUFFile, name: str, place: Placement) -> QuantLinear:
        """The layer `name` of the file: `name.weight` and, when the file has one, `name.bias`."""
        info = gguf.tensor_info(f"{name}.weight")
        bias = None
        if f"{name}.bias" in gguf.tensors:
            b = gguf.tensor_info(f"{name}.bias")
            bias = dequantize(gguf.tensor_bytes(b.name), b.qtype, b.shape)
        out_features, in_features = info.shape
        return cls(gguf.tensor_bytes(info.name), info.qtype, (out_features, in_features), place, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            assert self.weight is not None
            return F.linear(x, self.weight, self.bias)
        from strata.kernels.quant_matvec import MAX_M, quant_matvec

        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] <= MAX_M:
            n, k = self.out_features, self.in_features
            y = quant_matvec(flat, self.packed, self.qtype, n, k, bias=self.bias)
        else:
            from strata.kernels.quant_matmul import quant_matmul

            y = quant_matmul(flat, self.packed)
            if self.bias is not None:
                y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        path = "fused kernels" if self.packed is not None else "dense"
        bias = self.bias is not None
        return f"{self.in_features} -> {self.out_features}, {self.qtype.name}, {path}, bias={bias}"


def _has_kernel(qtype: GGMLQuantizationType) -> bool:
    from strata.kernels.quant_matvec import MATVEC_TYPES

    return qtype in MATVEC_TYPES
