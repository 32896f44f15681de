"""Synthetic GGUF models: random weights in the exact layout of real ones, with the real tokenizer."""

from strata.synth.layouts import BUILTIN_LAYOUTS, Layout, LayoutError, TensorPlan, load_layout, plan_tensors
from strata.synth.writer import WriteStats, write_layout

__all__ = [
    "BUILTIN_LAYOUTS",
    "Layout",
    "LayoutError",
    "TensorPlan",
    "WriteStats",
    "load_layout",
    "plan_tensors",
    "write_layout",
]
