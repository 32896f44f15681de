"""The int8-x decode matvecs' launches: x quantized (`int8_inputs.quantize_x`, or a norm's or the
attention merge's copy) times a weight packed by `quant_pack` (`quant_matvec` picks the kernel)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import triton
from gguf.constants import GGMLQuantizationType

from strata import env
from strata.kernels._int8_x import Int8X
from strata.kernels._matvec_legacy_int8 import legacy_int8_matvec_kernel
from strata.kernels._matvec_q4k_int8 import q4_k_int8_matvec_kernel
from strata.kernels._matvec_q4k_rows import q4_k_rows_int8_matvec, rows_config
from strata.kernels._matvec_q6k_int8 import q6_k_int8_matvec_kernel
from strata.kernels._matvec_q6k_rows import q6_k_rows_int8_matvec, q6k_rows_config
from strata.kernels.int8_inputs import use_asm
from strata.kernels.pdl import launch_args
from strata.kernels.quant_pack import PackedQuantWeight
from strata.kernels.split_locks import split_locks

if TYPE_CHECKING:
    from strata.kernels.quant_matvec import MatvecConfig

_T = GGMLQuantizationType


def rows_matvec(
    xq: Int8X,
    w: PackedQuantWeight,
    out: torch.Tensor,
    bias: torch.Tensor | None,
    num_sms: int,
    kv: dict[str, object] | None = None,
) -> None:
    """x's rows quantized (Q4_K: planar order; Q6_K: element order) times w in the "rows" layout, into
    out, by `_matvec_q4k_rows` or `_matvec_q6k_rows`; `kv`: Q6_K's K/V-write arguments (`KVWrite`)."""

    def workspace(split_k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if split_k == 1:
            return None
        # partials with out's row stride (the kernel addresses both alike)
        partials = torch.empty(split_k, out.shape[0], out.stride(0), dtype=torch.float32, device=out.device)
        return partials, split_locks(out.device, triton.cdiv(w.n, w.rows_group))

    asm = use_asm(xq[0])
    if w.planar:
        cfg = replace(rows_config(w.n, w.k, w.rows_group, num_sms), preload=env.rows_preload())
        q4_k_rows_int8_matvec(
            *xq, w.planes, w.n, w.k, out, cfg, bias=bias, use_asm=asm, workspace=workspace(cfg.split_k),
        )  # fmt: skip
    else:
        cfg6 = q6k_rows_config(w.n, w.k, w.rows_group, num_sms, env.q6k_halves())
        cfg6 = replace(cfg6, preload=env.rows_preload())
        q6_k_rows_int8_matvec(
            xq[0], xq[1], w.planes, w.n, w.k, out, cfg6, bias=bias, use_asm=asm,
            workspace=workspace(cfg6.split_k), kv=kv,
        )  # fmt: skip


def int8_matvec(
    qtype: GGMLQuantizationType,
    x_int8: Int8X,
    dest: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    has_bias: bool,
    planes: list[torch.Tensor],
    strides: list[int],
    grid: tuple[int, int],
    n: int,
    k: int,
    stride_ys: int,
    cfg: MatvecConfig,
    rows_group: int = 0,
    kv: dict[str, object] | None = None,
) -> None:
    """The dp4a matvec of x quantized by `quantize_x` (`x_int8`); `dest` is the kernels' (workspace,
    out, split locks, bias) arguments; `rows_group`: Q4_K's "rows" layout;
    `kv`: the K/V-write arguments (`KVWrite.kernel_args`) of Q4_K's, Q8_0's and Q5_0's kernels."""
    xq, xd, xs = x_int8
    m, stride_ym = xq.shape[0], dest[1].stride(0)  # out's rows (the workspace's too)
    common = dict(
        M=m, M_PAD=triton.next_power_of_2(m), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        SPLIT_K=cfg.split_k, HAS_BIAS=has_bias, **cfg.launch_options(),
        **launch_args(xq.device),
        # Triton's interpreter runs no inline PTX: it takes the byte-by-byte twin of dp4a.
        USE_ASM=use_asm(xq),
    )  # fmt: skip
    # The quant planes as int32 words (each row a whole number of words); scales and d as they are.
    if qtype == _T.Q6_K:
        ql, qh, sc, d = planes
        ql, qh = ql.view(torch.int32), qh.view(torch.int32)
        q6_k_int8_matvec_kernel[grid](
            xq, xd, *dest, ql, qh, sc, d, n, k, stride_ys, stride_ym,
            ql.stride(0), qh.stride(0), sc.stride(0), d.stride(0), SCALAR_SCALES=cfg.scalar_scales,
            PREFETCH=cfg.prefetch, PRELOAD=cfg.preload, **common,
        )  # fmt: skip
    elif qtype in (_T.Q8_0, _T.Q5_0):
        qs, *rest = planes
        qs = qs.view(torch.int32)
        qh, d = rest if qtype == _T.Q5_0 else (qs, rest[0])  # Q8_0 has no qh: any pointer will do
        legacy_int8_matvec_kernel[grid](
            xq, xd, *dest, qs, qh, d, n, k, stride_ys, stride_ym, qs.stride(0), qh.stride(0), d.stride(0),
            QTYPE=int(qtype), MATCHED=cfg.matched_loads, PRELOAD=cfg.preload, LANE_BLOCKS=cfg.lane_blocks,
            **common, **(kv or {}),
        )  # fmt: skip
    else:
        q4_k_int8_matvec_kernel[grid](
            xq, xd, xs, *dest, *planes, n, k, stride_ys, stride_ym, *strides,
            ROWS_AT_ONCE=cfg.rows_at_once, FLAT_ACC=cfg.flat_acc, SCALAR_SCALES=cfg.scalar_scales,
            PREFETCH=cfg.prefetch, PAIRED_DM=cfg.paired_dm, ROWS=rows_group,
            PRELOAD=cfg.preload,
            **common, **(kv or {}),
        )  # fmt: skip
