"""Dequantization of GGUF quantized tensors, bit-identical to gguf.quants."""

from strata.quant.dequant import SUPPORTED_TYPES, dequantize, dequantize_rows

__all__ = ["SUPPORTED_TYPES", "dequantize", "dequantize_rows"]
