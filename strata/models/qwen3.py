"""`qwen3`: the llama block with RMSNorm on each query and key head before rotary (QK-norm)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from strata.engine.kv_cache import AttentionMetadata, KVCache
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.layers.norm import RMSNorm
from strata.layers.placement import Placement
from strata.models.llama import LlamaBlock, LlamaModel

if TYPE_CHECKING:
    from strata.kernels.kv_in_matvec import KVWrite


class Qwen3Block(LlamaBlock):
    def __init__(self, gguf: GGUFFile, spec: ModelSpec, layer: int, place: Placement) -> None:
        super().__init__(gguf, spec, layer, place)
        self.attn_q_norm = RMSNorm.load(gguf, f"blk.{layer}.attn_q_norm", spec.rms_eps, place.kernels)
        self.attn_k_norm = RMSNorm.load(gguf, f"blk.{layer}.attn_k_norm", spec.rms_eps, place.kernels)

    def kv_write(self, h: torch.Tensor, kv: KVCache, meta: AttentionMetadata) -> None:
        """None: q and k are normed between their projection and the rotation, which the matvec's store
        would do first."""
        return None

    def qkv(self, h: torch.Tensor, kv_write: KVWrite | None = None) -> tuple[torch.Tensor, ...]:
        assert kv_write is None  # see kv_write
        q, k, v = super().qkv(h)
        return self.attn_q_norm(q), self.attn_k_norm(k), v


class Qwen3Model(LlamaModel):
    def build_block(self, gguf: GGUFFile, layer: int) -> nn.Module:
        return Qwen3Block(gguf, self.spec, layer, self.place)
