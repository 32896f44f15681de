"""Grouped-query attention over a paged KV store handed in by the caller (torch reference)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from strata import env
from strata.engine.kv_cache import AttentionMetadata, KVCache, PagedDecode, PagedPrefill
from strata.layers.rotary import RotaryEmbedding

if TYPE_CHECKING:
    from strata.kernels.kv_in_matvec import KVWrite
    from strata.layers.linear import Projections, QuantLinear


class Attention(nn.Module):
    """Rotates q and k, writes this step's K/V at their slots, then attends each sequence over its
    context's slots. On the kernel path rotation and the K/V write are one kernel, or, on decode steps,
    done by the q, k, v projections' matvecs (`kv_write`, STRATA_ROPE_IN_MATVEC=1)."""

    def __init__(
        self,
        layer: int,
        num_heads: int,
        num_kv_heads: int,
        scale: float,
        window: int | None,
        rotary: RotaryEmbedding,
        fused: bool = False,
    ):
        super().__init__()
        self.layer, self.num_heads, self.num_kv_heads = layer, num_heads, num_kv_heads
        self.scale, self.window, self.rotary, self.fused = scale, window, rotary, fused
        # The int8 order of the projection the decode output feeds (see `quantize_for`); None: none.
        self.int8_order: bool | None = None
        self.matvec_rows = 0

    def quantize_for(self, output: QuantLinear) -> None:
        """With STRATA_QUANT_IN_MERGE=1 on the kernel path, decode outputs of up to STRATA_MATVEC_ROWS
        rows come with their int8 quantization for `output` (the o projection, if it multiplies int8
        x), made by the attention's merge kernel and found by its matvec (`int8_inputs.attached_int8`)."""
        if self.fused and env.quant_in_merge() and output.packed is not None and output.pad is None:
            from strata.kernels.int8_inputs import int8_order

            self.int8_order = int8_order(output.packed)
            self.matvec_rows = env.kernel_row_limits()[0]

    def kv_write(
        self, x: torch.Tensor, projections: Projections, kv: KVCache, meta: AttentionMetadata
    ) -> KVWrite | None:
        """The K/V write for `projections` (q, k, v of x) to make in their matvecs' stores on this step
        (then `forward(..., written=True)`), or None: a decode step on the kernel path under
        STRATA_ROPE_IN_MATVEC=1, the whole head rotated, every part's matvec able to
        (`Projections.writes_kv`)."""
        if not (self.fused and meta.paged is not None and env.rope_in_matvec()):
            return None
        r = self.rotary
        k_cache, v_cache = kv.layer(self.layer)
        dim = k_cache.shape[-1]
        q_rows, k_rows = self.num_heads * dim, self.num_kv_heads * dim
        if r.dim != dim or not projections.writes_kv(x, q_rows, k_rows, dim):
            return None
        from strata.kernels.kv_in_matvec import KVWrite

        write = KVWrite(meta.positions, meta.slot_mapping, r.inv_freq, k_cache, v_cache, r.layout, r.scale)
        return write.part(q_rows, k_rows)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv: KVCache,
        meta: AttentionMetadata,
        written: bool = False,
    ) -> torch.Tensor:
        """q: (num_tokens, num_heads, head_dim); k, v: (num_tokens, num_kv_heads, head_dim); not rotated,
        unless `written`: q rotated and this step's K/V in the cache already (`kv_write`)."""
        if written:
            assert meta.paged is not None
            return self._paged_decode(q, kv, meta.paged)
        if self.fused:
            from strata.kernels.rotary_kv import rotary_kv_write  # needs triton

            r = self.rotary
            k_cache, v_cache = kv.layer(self.layer)
            rotary_kv_write(
                q, k, v, meta.positions, r.inv_freq, k_cache, v_cache, meta.slot_mapping,
                rope_dim=r.dim, layout=r.layout, scale=r.scale,
            )  # fmt: skip
        else:
            q, k = self.rotary(q, meta.positions), self.rotary(k, meta.positions)
            kv.write(self.layer, meta.slot_mapping, k, v)
        if meta.paged is not None:
            return self._paged_decode(q, kv, meta.paged)
        if meta.paged_prefill is not None:
            return self._paged_prefill(q, kv, meta.paged_prefill)
        outs = []
        for seq, rows in enumerate(meta.query_slices()):
            keys, values = kv.read(self.layer, meta.context_slots[seq])  # (context_len, kv_heads, dim)
            out = F.scaled_dot_product_attention(
                q[rows].transpose(0, 1),
                keys.to(q.dtype).transpose(0, 1),
                values.to(q.dtype).transpose(0, 1),
                attn_mask=meta.mask(seq, rows, self.window),
                scale=self.scale,
                enable_gqa=self.num_heads != self.num_kv_heads,
            )
            outs.append(out.transpose(0, 1))
        return torch.cat(outs).flatten(1)  # (num_tokens, num_heads * head_dim)

    def _paged_decode(self, q: torch.Tensor, kv: KVCache, paged: PagedDecode) -> torch.Tensor:
        from strata.kernels.paged_attention import paged_decode_attention  # needs triton

        k_cache, v_cache = kv.layer(self.layer)
        max_splits, programs_per_sm = env.decode_splits()
        block_t, warps, stages, split_len = env.decode_attention_launch()
        out = paged_decode_attention(
            q, k_cache, v_cache, paged.block_tables, paged.context_lens,
            block_size=paged.block_size, scale=self.scale, window=self.window,
            num_splits=paged.num_splits, max_context_len=paged.max_context_len,
            min_split_len=split_len if env.live_splits() else 1,
            max_splits=paged.max_splits or max_splits, programs_per_sm=programs_per_sm, split_len=split_len,
            block_t=paged.block_t or block_t or None, num_warps=warps, merge_warps=env.merge_warps() or None,
            num_stages=paged.num_stages or stages or None,
            int8_order=self.int8_order if self._quantizes(q) else None,
        )  # fmt: skip
        from strata.kernels.int8_inputs import attach_int8, attached_int8

        int8 = attached_int8(out)
        return out.flatten(1) if int8 is None else attach_int8(out.flatten(1), int8)

    def _quantizes(self, q: torch.Tensor) -> bool:
        """Whether the decode output of q's rows feeds an int8 matvec: 16-bit rows, few enough."""
        return q.shape[0] <= self.matvec_rows and q.dtype != torch.float32

    def _paged_prefill(self, q: torch.Tensor, kv: KVCache, paged: PagedPrefill) -> torch.Tensor:
        from strata.kernels.paged_prefill_attention import paged_prefill_attention  # needs triton

        k_cache, v_cache = kv.layer(self.layer)
        out = paged_prefill_attention(
            q, k_cache, v_cache, paged.block_tables, paged.context_lens, paged.query_start,
            block_size=paged.block_size, max_query_len=paged.max_query_len, scale=self.scale,
            window=self.window,
        )  # fmt: skip
        return out.flatten(1)
