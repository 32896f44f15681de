"""One rank's part of a GGUF weight, cut from the stored bytes without dequantizing.

A quantized matrix of shape (rows, cols) is stored row after row, each row `cols / block_size` blocks
of `type_size` bytes, and every block decodes on its own. So a run of rows is a run of bytes, and a
run of columns that starts and ends on block boundaries is the same run of blocks in every row: both
parts dequantize to exactly the matching slice of the whole matrix.

How each GGUF tensor splits (Megatron's scheme, by output rows of W in y = x W^T):

- "out" (column-parallel): q/k/v by attention (KV) heads, ffn_gate and ffn_up by FFN rows; biases with them.
- "in" (row-parallel): attn_output by its heads' input columns, ffn_down by FFN columns; each rank's
  product is a partial sum, and one all-reduce after the matmul completes it.
- "vocab": the token embedding and the output head by vocabulary rows, in ceil(vocab / N) runs (the
  last run may be shorter, so any vocabulary size splits).

The FFN dimension splits into runs of whole blocks of the layer's ffn_down type, as even as possible
(the 7B's 74 K-quant blocks over 4 ranks: 19, 19, 18, 18), so ffn_down's parts are whole blocks and
ffn_gate/ffn_up take the same rows; ranks' FFN widths may differ. Heads split evenly, so attn_output's
column run may start or end inside a block (the 7B's 3,584 columns over 4 ranks: 896 each, 3.5 Q4_K
blocks). Such a rank stores the whole blocks that overlap its run (its window) and feeds the layer its
input padded with zeros to the window: the other ranks' columns in it multiply exact zeros.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from strata.parallel.group import TensorParallel

Split = Literal["out", "in", "vocab"]

# By the last part of the GGUF layer name (`blk.3.attn_q` -> `attn_q`); tensors not named here (norms)
# are whole on every rank.
SPLITS: dict[str, Split] = {
    "attn_q": "out",
    "attn_k": "out",
    "attn_v": "out",
    "ffn_gate": "out",
    "ffn_up": "out",
    "attn_output": "in",
    "ffn_down": "in",
    "token_embd": "vocab",
    "output": "vocab",
}
FFN = ("ffn_gate", "ffn_up", "ffn_down")  # split together, by runs of ffn_down's blocks


class TensorShape(Protocol):
    """What a split needs to know of a tensor: a `GGUFFile.tensors` entry, or a synthetic layout's plan."""

    @property
    def qtype(self) -> GGMLQuantizationType: ...

    @property
    def shape(self) -> tuple[int, ...]: ...


TensorTable = Mapping[str, TensorShape]  # GGUF tensor name -> its type and torch-order shape


@dataclass(frozen=True)
class Part:
    """One rank's run `start..end` of a split matrix's rows ("out", "vocab") or columns ("in"), and the
    run it stores, `stored_start..stored_end`: for a column run off block boundaries the whole blocks
    around it, otherwise the run itself."""

    start: int
    end: int
    stored_start: int
    stored_end: int

    @property
    def pad(self) -> tuple[int, int] | None:
        """The zero columns (left, right) around the rank's input that fill its stored window; None when
        the run is stored as it is."""
        left, right = self.start - self.stored_start, self.stored_end - self.end
        return (left, right) if left or right else None


def split_of(layer: str) -> Split | None:
    """How the layer named `layer` (a GGUF tensor name without `.weight`/`.bias`) is split."""
    return SPLITS.get(layer.rsplit(".", 1)[-1])


def _flag(size: int) -> str:
    return f"--tensor-parallel {size}"


def even_range(name: str, shape: tuple[int, ...], dim: int, tp: TensorParallel) -> tuple[int, int]:
    """Rank `tp.rank`'s equal run of `shape[dim]`; ValueError naming the tensor when it does not divide."""
    n = shape[dim]
    if n % tp.size:
        what = "rows" if dim == 0 else "columns"
        raise ValueError(
            f"tensor {name} of shape {shape}: its {n} {what} do not split evenly over {tp.size} ranks "
            f"({_flag(tp.size)}); choose a tensor-parallel size that divides {n}"
        )
    part = n // tp.size
    return tp.rank * part, (tp.rank + 1) * part


def vocab_range(name: str, rows: int, tp: TensorParallel) -> tuple[int, int]:
    """Rank `tp.rank`'s vocabulary rows: runs of ceil(rows / size), the last one shorter when needed."""
    width = -(-rows // tp.size)
    if (tp.size - 1) * width >= rows:
        raise ValueError(
            f"tensor {name} of shape ({rows}, ...): {rows} vocabulary rows leave rank {tp.size - 1} "
            f"of {tp.size} ({_flag(tp.size)}) without a row; use fewer ranks"
        )
    return tp.rank * width, min(rows, (tp.rank + 1) * width)


def ffn_range(table: TensorTable, prefix: str, tp: TensorParallel) -> tuple[int, int]:
    """Rank `tp.rank`'s run of the FFN dimension of the model block `prefix` (`blk.3`): whole blocks of
    its ffn_down's quant type, the first `num_blocks % size` ranks one block more than the others."""
    name = f"{prefix}.ffn_down.weight"
    if name not in table:
        raise ValueError(f"tensor {name} is missing: the FFN of {prefix} cannot be split without it")
    qtype, shape = table[name].qtype, table[name].shape
    block_size = GGML_QUANT_SIZES[qtype][0]
    num_blocks = shape[-1] // block_size
    per_rank, extra = divmod(num_blocks, tp.size)
    if per_rank == 0:
        raise ValueError(
            f"tensor {name} of shape {shape} ({qtype.name}): its {shape[-1]} FFN columns are "
            f"{num_blocks} block(s) of {block_size}, fewer than {tp.size} ranks ({_flag(tp.size)}); "
            f"use at most {num_blocks} ranks"
        )
    first = tp.rank * per_rank + min(tp.rank, extra)
    return first * block_size, (first + per_rank + (tp.rank < extra)) * block_size


def part_of(table: TensorTable, layer: str, tp: TensorParallel) -> Part:
    """Rank `tp.rank`'s part of the split layer `layer` (a GGUF name without `.weight`/`.bias`), from
    its weight's entry in `table` (the file's tensors); ValueError naming the tensor if it does not split."""
    split, kind = split_of(layer), layer.rsplit(".", 1)[-1]
    if split is None:
        raise ValueError(f"layer {layer} is not split under tensor parallelism")
    name = f"{layer}.weight"
    info = table[name]
    if split == "vocab":
        start, end = vocab_range(name, info.shape[0], tp)
    elif kind in FFN:
        start, end = ffn_range(table, layer.rpartition(".")[0], tp)
    else:
        start, end = even_range(name, info.shape, 0 if split == "out" else 1, tp)
    if split != "in":
        return Part(start, end, start, end)
    block_size = GGML_QUANT_SIZES[info.qtype][0]
    return Part(start, end, start // block_size * block_size, -(-end // block_size) * block_size)


def row_bytes(
    raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...], start: int, end: int
) -> torch.Tensor:
    """The stored bytes of rows start..end-1 of a (rows, cols) matrix (a view when `raw` is contiguous)."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    per_row = shape[-1] // block_size * type_size
    return raw.reshape(shape[0], per_row)[start:end].reshape(-1)


def column_bytes(
    raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...], start: int, end: int
) -> torch.Tensor:
    """The stored bytes of columns start..end-1 of every row; both bounds must be block boundaries."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if start % block_size or end % block_size:
        raise ValueError(
            f"columns {start}..{end} do not start and end on {qtype.name} blocks of {block_size}"
        )
    blocks = raw.reshape(shape[0], shape[-1] // block_size, type_size)
    return blocks[:, start // block_size : end // block_size].contiguous().reshape(-1)


def shard_matrix(
    raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int], split: Split, part: Part
) -> tuple[torch.Tensor, tuple[int, int]]:
    """The stored bytes of `part` of the (rows, cols) matrix and the stored part's shape."""
    rows, cols = shape
    if split == "in":
        start, end = part.stored_start, part.stored_end
        return column_bytes(raw, qtype, shape, start, end), (rows, end - start)
    return row_bytes(raw, qtype, shape, part.start, part.end), (part.end - part.start, cols)


def shard_bias(
    bias: torch.Tensor | None, split: Split, part: Part, tp: TensorParallel
) -> torch.Tensor | None:
    """An "out" or "vocab" layer's bias goes with its rows. A row-parallel ("in") layer's bias is kept by
    rank 0 only, so the all-reduce of the partial sums adds it exactly once."""
    if bias is None:
        return None
    if split == "in":
        return bias if tp.rank == 0 else None
    return bias[part.start : part.end]
