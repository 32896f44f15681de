"""The start check: can this model split over N ranks? Run before any worker process starts, so a
shape that does not divide fails at once with a message naming the tensor, its shape and N."""

from __future__ import annotations

from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.parallel.group import TensorParallel
from strata.parallel.shard import TensorTable, part_of, split_of

# Layers split by attention heads: their rows (attn_output: columns) are heads * head_dim, so an even
# split of them is a head split only when the head count divides.
_HEADS = {
    "attn_q": "attention heads",
    "attn_k": "KV heads",
    "attn_v": "KV heads",
    "attn_output": "attention heads",
}


def check_shardable(gguf: GGUFFile, spec: ModelSpec, size: int) -> None:
    """ValueError naming the first tensor of the file whose shape does not split over `size` ranks."""
    check_tensors(gguf.tensors, spec.num_heads, spec.num_kv_heads, size)


def check_tensors(table: TensorTable, num_heads: int, num_kv_heads: int, size: int) -> None:
    """ValueError naming the first tensor of `table` (name -> type and shape) that does not split over
    `size` ranks: heads and KV heads must divide by `size`, every rank must get at least one of each
    FFN's blocks and one vocabulary row. Block boundaries are no limit (`strata.parallel.shard`)."""
    if size < 1:
        raise ValueError(f"--tensor-parallel {size}: the number of ranks must be at least 1")
    if size == 1:
        return
    # The checks do not depend on the rank; the last one's FFN and vocabulary runs are the shortest.
    tp = TensorParallel(size - 1, size)
    for name, info in table.items():
        layer, _, kind = name.rpartition(".")
        if split_of(layer) is None or kind != "weight":
            continue
        short = layer.rsplit(".", 1)[-1]
        if short in _HEADS:
            heads = num_kv_heads if _HEADS[short] == "KV heads" else num_heads
            if heads % size:
                raise ValueError(
                    f"tensor {name} of shape {info.shape}: its {heads} {_HEADS[short]} do not split "
                    f"evenly over {size} ranks (--tensor-parallel {size}); choose a size that divides {heads}"
                )
        part_of(table, layer, tp)
