"""One model class per GGUF `general.architecture`, and the registry that picks it."""

from __future__ import annotations

import torch

from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.layers.placement import Placement
from strata.models.base import DecoderModel
from strata.models.gemma3 import Gemma3Model
from strata.models.llama import LlamaModel
from strata.models.qwen2 import Qwen2Model
from strata.models.qwen3 import Qwen3Model
from strata.parallel.group import SINGLE, TensorParallel

MODEL_REGISTRY: dict[str, type[DecoderModel]] = {
    "llama": LlamaModel,
    "qwen2": Qwen2Model,
    "qwen3": Qwen3Model,
    "gemma3": Gemma3Model,
}


def build_model(
    gguf: GGUFFile,
    spec: ModelSpec,
    dtype: torch.dtype = torch.float32,
    progress: bool = False,
    device: str | torch.device = "cpu",
    tp: TensorParallel = SINGLE,
) -> DecoderModel:
    """The architecture's model with every weight loaded from `gguf` by its GGUF name, on `device`;
    under tensor parallelism (`tp`), this rank's part of every split layer."""
    place = Placement.of(dtype, device, tp)
    return MODEL_REGISTRY[spec.architecture](gguf, spec, place, progress).eval()
