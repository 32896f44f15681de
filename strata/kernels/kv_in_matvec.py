"""A decode step's rotary embedding and K/V-cache write done in the store of the q, k, v projections'
matvecs (STRATA_ROPE_IN_MATVEC) instead of by `rotary_kv_write`'s launch of its own.

A projection's output rows are q's heads, then k's, then v's (any of the three may be absent: a
stacked q+k+v, a q+k beside a v of another type). A row tile of q or k rows takes BLOCK_N / 2 whole
channel pairs of one head (`kv_tile_rows`: for the "neox" layout the channels i .. and i + half ..,
rows which the matvecs load one by one anyway), so the tile's store can rotate them in registers: the
values rounded to the output's dtype, rotated by `rotary_kv`'s helpers (`rope_channels`,
`rope_rotate`: the same operations, so the same bits), rounded again. q's rows are stored rotated in
the output, v's as they are; k's rotated and v's go, at the token's slot, to the caches (rounded to
theirs), as `rotary_kv_write` would write them. The output's k columns are not written. Each token's
slot and the cos and sin of its angles are loaded and computed where the kernel starts, before its PDL
wait (`kv_prologue`), not in the store.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
import triton
import triton.language as tl

from strata.kernels.rotary_kv import rope_channels, rope_cos_sin, rope_rotate

_INDEX = (torch.int32, torch.int64)


@dataclass(frozen=True)
class KVWrite:
    """What a projection's matvec needs to rotate and write a decode step's K/V: per token its position
    and cache slot (a negative slot writes nothing), the rotation (`inv_freq`, `layout`, `scale`, the
    whole head rotated) and the caches, (slots, kv_heads, head_dim) each with contiguous slots and the
    same strides (`KVCache.layer`'s views). `q_rows` and `k_rows`: how many of the projection's output
    rows are q's and k's (the rest are v's), set per projection by `part`."""

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    inv_freq: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    layout: Literal["neox", "interleaved"]
    scale: float = 1.0
    q_rows: int = 0
    k_rows: int = 0

    @property
    def head_dim(self) -> int:
        return self.k_cache.shape[2]

    def part(self, q_rows: int, k_rows: int) -> KVWrite:
        """This write for a projection whose first `q_rows` rows are q's, the next `k_rows` k's."""
        return replace(self, q_rows=q_rows, k_rows=k_rows)

    def parts(self, sizes: list[int]) -> list[KVWrite | None]:
        """This write (for q, k, v side by side) for each of the projections of `sizes` rows that
        make them up, in order: the q and k rows among each one's own."""
        out: list[KVWrite | None] = []
        start, qk = 0, self.q_rows + self.k_rows
        for n in sizes:
            q = max(0, min(start + n, self.q_rows) - start)
            out.append(self.part(q, max(0, min(start + n, qk) - max(start, self.q_rows))))
            start += n
        return out

    def kernel_args(self, out: torch.Tensor, block_n: int, v_only: bool = False) -> dict[str, object]:
        """The matvec kernels' launch arguments for an output `out` (tokens, n) in row tiles of
        `block_n`; raises where the write cannot go in that launch. `v_only`: for a kernel that takes
        v's rows only (Q6_K's rows layout: no KV_Q, KV_K, INTERLEAVED)."""
        self.check(out, block_n)
        args: dict[str, object] = {
            "kv_pos_ptr": self.positions, "kv_slot_ptr": self.slot_mapping, "kv_freq_ptr": self.inv_freq,
            "k_cache_ptr": self.k_cache, "v_cache_ptr": self.v_cache, "rope_scale": float(self.scale),
            "stride_cache": self.k_cache.stride(0), "HEAD_DIM": self.head_dim,
        }  # fmt: skip
        if not v_only:
            interleaved = self.layout == "interleaved"
            return args | {"KV_Q": self.q_rows, "KV_K": self.k_rows, "INTERLEAVED": interleaved}
        if self.q_rows or self.k_rows:
            raise ValueError(f"{self.q_rows} q and {self.k_rows} k rows need a kernel that rotates")
        return args

    def check(self, out: torch.Tensor, block_n: int) -> None:
        m, n = out.shape
        hd, kv_heads = self.head_dim, self.k_cache.shape[1]
        v_rows = n - self.q_rows - self.k_rows
        k_cache, v_cache = self.k_cache, self.v_cache
        if (
            k_cache.dim() != 3
            or k_cache.stride()[1:] != (hd, 1)
            or (v_cache.shape, v_cache.stride()) != (k_cache.shape, k_cache.stride())
        ):
            raise ValueError(
                "the K/V write in the matvec needs caches of (slots, kv_heads, head_dim) with contiguous "
                f"slots, of one shape and strides; got {tuple(k_cache.shape)} {k_cache.stride()} and "
                f"{tuple(v_cache.shape)} {v_cache.stride()}; pass KVCache.layer's views, or leave kv out"
            )
        if (
            min(self.q_rows, self.k_rows, v_rows) < 0
            or max(self.k_rows, v_rows) > kv_heads * hd
            or any(r % hd for r in (self.q_rows, self.k_rows, v_rows))
        ):
            raise ValueError(
                f"a projection of {n} rows cannot hold q {self.q_rows}, k {self.k_rows} and v {v_rows} rows "
                f"of whole heads of {hd} (at most {kv_heads} KV heads); pass part(q_rows, k_rows) of this "
                "projection's own rows"
            )
        if self.q_rows + self.k_rows and (hd % block_n or block_n < 2):
            raise ValueError(
                f"the rotary embedding in the matvec needs row tiles that divide head_dim {hd}, got "
                f"{block_n}; use a MatvecConfig whose block_n divides it, or leave kv out"
            )
        if self.inv_freq.shape != (hd // 2,) or self.inv_freq.dtype != torch.float32:
            raise ValueError(
                f"inv_freq must be ({hd // 2},) fp32 (the whole head rotated), got "
                f"{tuple(self.inv_freq.shape)} {self.inv_freq.dtype}"
            )
        for name, t in (("positions", self.positions), ("slot_mapping", self.slot_mapping)):
            if t.dtype not in _INDEX or t.dim() != 1 or t.shape[0] < m or t.device != out.device:
                raise ValueError(
                    f"{name} must be 1-D int32/int64 on {out.device} with at least {m} entries (one a row), "
                    f"got {tuple(t.shape)} {t.dtype} on {t.device}"
                )
        if self.layout not in ("neox", "interleaved") or not self.scale > 0:
            raise ValueError(
                f"layout must be neox or interleaved and scale > 0, got {self.layout}, {self.scale}"
            )


@triton.jit
def kv_tile_rows(tile, BLOCK_N: tl.constexpr, KV_QK: tl.constexpr, HEAD_DIM: tl.constexpr,
                 INTERLEAVED: tl.constexpr):  # fmt: skip
    """The output rows of row tile `tile`: tile * BLOCK_N + 0 .., except, under the K/V write
    (HEAD_DIM > 0) with "neox" pairs, a tile among the first KV_QK (rotated) rows, which takes
    BLOCK_N / 2 consecutive pairs (i, i + HEAD_DIM / 2) of one head: their first channels, then their
    second. The tiles of a head still cover its rows once."""
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    if HEAD_DIM > 0 and not INTERLEAVED:
        start = tile * BLOCK_N
        j = tl.arange(0, BLOCK_N)
        half = j % (BLOCK_N // 2) + (j // (BLOCK_N // 2)) * (HEAD_DIM // 2)
        paired = (start // HEAD_DIM) * HEAD_DIM + (start % HEAD_DIM) // 2 + half
        rows = tl.where(start < KV_QK, paired, rows)
    return rows


@triton.jit
def kv_prologue(rows, pos_ptr, slot_ptr, freq_ptr, kc_ptr, vc_ptr, rope_scale, stride_cache, M: tl.constexpr,
                M_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, INTERLEAVED: tl.constexpr,
                ROTATES: tl.constexpr = True):  # fmt: skip
    """The K/V write's arguments for `store_kv` (called where HEAD_DIM > 0): each token's slot and the
    cos and sin of its angles at the tile's channels (`rows`), loaded and computed where the kernel
    starts, before its PDL wait: a step's positions and slots are written before any of its kernels
    runs, so that their loads and the cos and sin (`rope_cos_sin`) leave the store's path. Without
    ROTATES (a launch of v's rows only) no cos or sin is computed (or held)."""
    mi = tl.arange(0, M_PAD)
    slot = tl.load(slot_ptr + mi, mask=mi < M, other=-1).to(tl.int64)
    if ROTATES:  # the padding rows (M .. M_PAD) take the last token's angles, which nothing stores
        rotated, _, freq, _ = rope_channels(rows % HEAD_DIM, HEAD_DIM, INTERLEAVED)
        t = tl.minimum(mi, M - 1)[:, None]
        cos, sin = rope_cos_sin(pos_ptr, t, freq_ptr, rope_scale, freq[None, :], rotated[None, :])
    else:  # (a constant's branch: one of the two is compiled)
        cos, sin = rope_scale, rope_scale  # unread: `store_kv` rotates no row
    return cos, sin, slot, kc_ptr, vc_ptr, stride_cache


@triton.jit
def store_kv(out_ptr, at, inside, value, rows, kv, M: tl.constexpr, M_PAD: tl.constexpr,
             BLOCK_N: tl.constexpr, KV_Q: tl.constexpr, KV_K: tl.constexpr, HEAD_DIM: tl.constexpr,
             INTERLEAVED: tl.constexpr):  # fmt: skip
    """Store the tile's fp32 `value` (M_PAD, BLOCK_N) of output rows `rows` (`kv_tile_rows`) rounded
    to out's dtype and, in q's and k's rows, rotated (then rounded again): q's and v's at out + `at`
    where `inside`, k's and v's in their cache at each token's slot (k's nowhere else: out's k columns
    are left as they were). `kv`: `kv_prologue`'s values."""
    cos, sin, slot, kc_ptr, vc_ptr, stride_cache = kv
    y = value.to(out_ptr.dtype.element_ty)
    start = tl.program_id(0) * BLOCK_N
    if start < KV_Q + KV_K:
        x = y.to(tl.float32)
        if INTERLEAVED:  # pairs (2i, 2i + 1): a channel's partner is its neighbour
            partner = tl.reshape(tl.flip(tl.reshape(x, (M_PAD, BLOCK_N // 2, 2)), 2), (M_PAD, BLOCK_N))
        else:  # the tile's two halves are the pairs' two channels (`kv_tile_rows`)
            partner = tl.reshape(tl.flip(tl.reshape(x, (M_PAD, 2, BLOCK_N // 2)), 1), (M_PAD, BLOCK_N))
        rotated, _, _, sign = rope_channels(rows % HEAD_DIM, HEAD_DIM, INTERLEAVED)
        y = rope_rotate(x, partner, sign[None, :], cos, sin, rotated[None, :])
        y = y.to(out_ptr.dtype.element_ty)
    if start < KV_Q or start >= KV_Q + KV_K:  # k's rows go to the cache only
        tl.store(out_ptr + at, y, mask=inside)
    ok = inside & (slot >= 0)[:, None]
    if start >= KV_Q:
        if start < KV_Q + KV_K:
            to = kc_ptr + slot[:, None] * stride_cache + (rows - KV_Q)[None, :]
            tl.store(to, y.to(kc_ptr.dtype.element_ty), mask=ok)
        else:
            to = vc_ptr + slot[:, None] * stride_cache + (rows - KV_Q - KV_K)[None, :]
            tl.store(to, y.to(vc_ptr.dtype.element_ty), mask=ok)
