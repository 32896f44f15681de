"""One rank's part of a GGUF weight, cut from the stored bytes without dequantizing.

A quantized matrix of shape (rows, cols) is stored row after row, each row `cols / block_size` blocks
of `type_size` bytes, and every block decodes on its own. So a run of rows is a run of bytes, and a
run of columns that starts and ends on block boundaries is the same run of blocks in every row: both
parts dequantize to exactly the matching slice of the whole matrix.

How each GGUF tensor splits (Megatron's scheme, by output rows of W in y = x W^T):

- "out" (column-parallel): q/k/v by attention (KV) heads, ffn_gate and ffn_up by rows; biases with them.
- "in" (row-parallel): attn_output and ffn_down by input columns, on block boundaries; each rank's
  product is a partial sum, and one all-reduce after the matmul completes it.
- "vocab": the token embedding and the output head by vocabulary rows, in ceil(vocab / N) runs (the
  last run may be shorter, so any vocabulary size splits).
"""

from __future__ import annotations

from typing import Literal

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


def column_range(
    name: str, qtype: GGMLQuantizationType, shape: tuple[int, ...], tp: TensorParallel
) -> tuple[int, int]:
    """Rank `tp.rank`'s equal run of columns, which must also fall on the type's block boundaries."""
    start, end = even_range(name, shape, 1, tp)
    block_size = GGML_QUANT_SIZES[qtype][0]
    if (end - start) % block_size:
        raise ValueError(
            f"tensor {name} of shape {shape} ({qtype.name}): {tp.size} ranks ({_flag(tp.size)}) would get "
            f"{end - start} columns each, not a whole number of {qtype.name} blocks of {block_size}; "
            "choose a tensor-parallel size that keeps each part on block boundaries"
        )
    return start, end


def shard_matrix(
    name: str,
    raw: torch.Tensor,
    qtype: GGMLQuantizationType,
    shape: tuple[int, int],
    split: Split,
    tp: TensorParallel,
) -> tuple[torch.Tensor, tuple[int, int]]:
    """This rank's stored bytes of the (rows, cols) matrix `name` and the part's shape."""
    rows, cols = shape
    if split == "in":
        start, end = column_range(name, qtype, shape, tp)
        return column_bytes(raw, qtype, shape, start, end), (rows, end - start)
    start, end = vocab_range(name, rows, tp) if split == "vocab" else even_range(name, shape, 0, tp)
    return row_bytes(raw, qtype, shape, start, end), (end - start, cols)


def shard_bias(name: str, bias: torch.Tensor | None, split: Split, tp: TensorParallel) -> torch.Tensor | None:
    """An "out" or "vocab" layer's bias goes with its rows. A row-parallel ("in") layer's bias is kept by
    rank 0 only, so the all-reduce of the partial sums adds it exactly once."""
    if bias is None:
        return None
    if split == "in":
        return bias if tp.rank == 0 else None
    shape = tuple(bias.shape)
    start, end = vocab_range(name, shape[0], tp) if split == "vocab" else even_range(name, shape, 0, tp)
    return bias[start:end]
