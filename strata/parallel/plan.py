"""The start check: can this model split over N ranks? Run before any worker process starts, so a
shape that does not divide fails at once with a message naming the tensor, its shape and N."""

from __future__ import annotations

from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.parallel.group import TensorParallel
from strata.parallel.shard import column_range, even_range, split_of, vocab_range

# Layers split by attention heads: their rows are heads * head_dim, so an even row split is a head
# split only when the head count divides.
_HEADS = {
    "attn_q": "attention heads",
    "attn_k": "KV heads",
    "attn_v": "KV heads",
    "attn_output": "attention heads",
}


def check_shardable(gguf: GGUFFile, spec: ModelSpec, size: int) -> None:
    """ValueError naming the first tensor whose shape does not split over `size` ranks."""
    if size < 1:
        raise ValueError(f"--tensor-parallel {size}: the number of ranks must be at least 1")
    if size == 1:
        return
    tp = TensorParallel(size - 1, size)  # the checks do not depend on the rank; the last is the tightest
    for name, info in gguf.tensors.items():
        layer, _, kind = name.rpartition(".")
        split = split_of(layer)
        if split is None or kind != "weight":
            continue
        short = layer.rsplit(".", 1)[-1]
        if short in _HEADS:
            heads = spec.num_kv_heads if _HEADS[short] == "KV heads" else spec.num_heads
            if heads % size:
                raise ValueError(
                    f"tensor {name} of shape {info.shape}: its {heads} {_HEADS[short]} do not split "
                    f"evenly over {size} ranks (--tensor-parallel {size}); choose a size that divides {heads}"
                )
        if split == "vocab":
            vocab_range(name, info.shape[0], tp)
        elif split == "in":
            column_range(name, info.qtype, info.shape, tp)
        else:
            even_range(name, info.shape, 0, tp)
