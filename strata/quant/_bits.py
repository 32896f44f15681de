"""Byte-level helpers shared by the block decoders: reinterpreting bytes and unpacking bit fields."""

from collections.abc import Sequence

import torch


def view_as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret the bytes of `t`'s last dim as `dtype`, copying first when alignment forbids a view."""
    t = t.contiguous()
    # torch refuses a wider-dtype view at an odd storage offset (e.g. a field slice of a 1-block tensor).
    if t.storage_offset() % dtype.itemsize:
        t = t.clone()
    return t.view(dtype)


def f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The little-endian float16 at byte `offset` of every block, as float32 of shape (n, 1)."""
    return view_as(blocks[:, offset : offset + 2], torch.float16).float()


def u16(x: torch.Tensor) -> torch.Tensor:
    """Little-endian uint16 values of consecutive byte pairs along the last dim, as int64."""
    x = x.long()
    return x[..., 0::2] | (x[..., 1::2] << 8)


def unpack(x: torch.Tensor, shifts: Sequence[int], mask: int, dim: int = -2) -> torch.Tensor:
    """Bit fields of each byte: `(x >> shift) & mask` for every shift, stacked on a new axis.

    With dim=-2 the result is (..., len(shifts), k): all bytes' first field, then all second fields
    (numpy's `x.reshape(..., 1, k) >> shifts.reshape(S, 1)`); with dim=-1 it is (..., k, len(shifts)).
    """
    # One shift at a time, with no tensor of shifts: a host-made constant would be a host-to-device
    # copy, which a CUDA graph capture (of an embedding lookup) refuses.
    return torch.stack([(x >> s) & mask for s in shifts], dim=-2 if dim == -2 else -1)
