"""`qwen2`: the llama block with Q/K/V biases (loaded from the file) and rotate-half rotary."""

from __future__ import annotations

from strata.models.llama import LlamaModel


class Qwen2Model(LlamaModel):
    pass
