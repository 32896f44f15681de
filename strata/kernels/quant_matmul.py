"""Launcher for the fused dequant + tensor-core matmul: y = x @ W^T with W kept as GGUF blocks.

For prefill and batched decode: x is (M, K) with any M >= 1 in fp16, bf16 or fp32; W is (N, K) in
a GGUF quant type packed once by `pack_quant_weight` (the planes the matvec kernels read). y has x's
dtype; products accumulate in fp32. W is decoded to the float32 values of `strata.quant.dequantize`
and, for 16-bit x, rounded to x's dtype before the tensor-core dot, as dequantize-then-cast would do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import triton
from gguf.constants import GGMLQuantizationType

from strata.kernels._matmul_quant import kernel_type, quant_matmul_kernel
from strata.kernels._matvec_lowbit import codebook
from strata.kernels.quant_pack import PackedQuantWeight, rows_planes
from strata.kernels.split_locks import split_locks

_T = GGMLQuantizationType
MATMUL_TYPES: frozenset[GGMLQuantizationType] = frozenset(
    {_T.Q8_0, _T.Q5_0, _T.Q4_0, _T.Q4_K, _T.Q6_K, _T.Q2_K, _T.IQ4_XS, _T.IQ2_XS, _T.IQ2_S}
)
_X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class MatmulConfig:
    """Tile of one program, (block_m, block_n) of y per BLOCK_K step, and its launch settings.

    block_m >= 16 and block_k >= 16 (tl.dot's minimum; W is decoded in groups of 16), all powers of
    two; group_m row tiles share a sweep over the N tiles (L2 reuse of W and x); swap_ab computes
    y^T = W x^T (see the kernel's docstring), a candidate for small M; split_k programs share each
    tile's K steps (for weights with too few tiles to fill the GPU), their fp32 partials summed by
    the last to finish.
    """

    block_m: int = 64
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    swap_ab: bool = False
    split_k: int = 1

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"MatmulConfig.{name} must be a power of two, got {value}")
        for name in ("block_m", "block_n", "block_k"):
            if getattr(self, name) < 16:
                raise ValueError(
                    f"MatmulConfig.{name} must be at least 16 (tl.dot), got {getattr(self, name)}"
                )
        if self.num_stages < 1 or self.group_m < 1 or self.split_k < 1:
            raise ValueError(
                "MatmulConfig.num_stages, group_m and split_k must be >= 1, got "
                f"{self.num_stages}, {self.group_m}, {self.split_k}"
            )


def default_config(qtype: GGMLQuantizationType, m: int, n: int, k: int) -> MatmulConfig:
    """The best of the sweeps in benchmarks/gpu_matmul.py on an H200 (Triton 3.6, bf16 x; the 7B's
    decode shapes at 16 and 64 rows, 2026-12-04): by M and the weight's shape, the same for every type.

    Up to 64 rows: one row tile as small as tl.dot allows (decoding W, not the tensor cores, is the
    limit). Wide weights (n >= 16,384: gate+up, the output head) take 64-row W tiles with K steps of
    64 and W as wgmma's register operand (swap_ab; 7B gate+up 1.58x at 16 rows, 1.17x at 64);
    long-K ones (k > 8,192: down) 16-row W tiles with K steps of 256 (1.07x, 1.10x), K split in 4 up
    to 16 rows (1.17x for Q4_K, 1.09x for Q6_K; none at 64); the rest keep narrow W tiles, K split
    when they have too few tiles to fill the GPU (`_splits`; the 7B's v and o at 64 rows). Above 64
    rows: 128 and then 256 rows per program with 8 warps, since each decoded W tile is reused by
    every row of the tile.
    """
    if m <= 64:
        bm = max(16, triton.next_power_of_2(m))
        if n >= 16384:
            return MatmulConfig(bm, 64, 64, num_warps=4, num_stages=3, swap_ab=True)
        if k > 8192:
            return MatmulConfig(bm, 16, 256, num_warps=4, num_stages=3, split_k=4 if m <= 16 else 1)
        cfg = MatmulConfig(bm, 16 if m <= 16 else 32, 128, num_warps=4, num_stages=3)
        return replace(cfg, split_k=_splits(m, n, k, cfg))
    if m <= 128:
        return MatmulConfig(128, 64, 128, num_warps=4, num_stages=3)
    return MatmulConfig(256, 128, 64, num_warps=8, num_stages=3)


# Programs a launch should have to keep an H200's 132 SMs busy (three to an SM); fewer tiles than
# this split their K steps, keeping at least MIN_SPLIT_STEPS steps per split.
TARGET_PROGRAMS = 396
MIN_SPLIT_STEPS = 4


def _splits(m: int, n: int, k: int, cfg: MatmulConfig) -> int:
    """How many splits of K give a launch of this tile about TARGET_PROGRAMS programs (at most 8)."""
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    by_steps = triton.cdiv(k, cfg.block_k) // MIN_SPLIT_STEPS
    return max(1, min(8, TARGET_PROGRAMS // tiles, by_steps))


def _kernel_args(w: PackedQuantWeight) -> tuple[list[torch.Tensor], list[int]]:
    """The kernel's four plane pointers and strides; unused ones repeat the first plane."""
    if w.planar and w.layout == "rows":
        return rows_planes(w)
    planes = list(w.planes)
    if w.qtype in (_T.IQ4_XS, _T.IQ2_XS, _T.IQ2_S):
        # The group decoders read quants from p0 and p1 only: the table goes second.
        planes.insert(1, codebook(w.qtype, w.device))
    if w.layout == "planar":
        # The int32 view of the quants: a sub-block is one 16-byte load of four words.
        planes[0] = planes[0].view(torch.int32)
    if w.qtype == _T.Q4_K and w.layout == "blocks":
        # The fp16 view of the raw blocks reads d and dmin without assembling bytes.
        planes.append(planes[0].view(torch.float16))
    planes += [planes[0]] * (4 - len(planes))
    return planes, [p.stride(0) for p in planes]


def _check(x: torch.Tensor, w: PackedQuantWeight, out: torch.Tensor | None) -> None:
    if not isinstance(w, PackedQuantWeight):
        raise TypeError(f"w must be a PackedQuantWeight from pack_quant_weight, got {type(w).__name__}")
    if w.qtype not in MATMUL_TYPES:
        supported = ", ".join(t.name for t in sorted(MATMUL_TYPES))
        raise ValueError(f"no fused matmul for GGML type {w.qtype.name}; supported: {supported}")
    if x.dim() != 2 or x.shape[1] != w.k or x.shape[0] < 1:
        raise ValueError(f"x must be (M, {w.k}) with M >= 1 for a weight with k={w.k}, got {tuple(x.shape)}")
    if x.dtype not in _X_DTYPES:
        raise TypeError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.device != w.device:
        raise ValueError(f"x is on {x.device} but the weight is on {w.device}")
    m, n = x.shape[0], w.n
    if out is not None and (
        out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1 or out.device != x.device
    ):
        raise ValueError(
            f"out must be a ({m}, {n}) {x.dtype} tensor on {x.device} with contiguous rows, "
            f"got {tuple(out.shape)} {out.dtype} on {out.device} with strides {out.stride()}"
        )
    if any(p.numel() >= 2**31 for p in w.planes):
        raise ValueError(f"weight planes over 2 GiB are not supported (int32 offsets): ({n}, {w.k})")


def quant_matmul(
    x: torch.Tensor,
    w: PackedQuantWeight,
    *,
    out: torch.Tensor | None = None,
    config: MatmulConfig | None = None,
) -> torch.Tensor:
    """y = x @ W^T for x (M, k), any M >= 1, and a packed GGUF weight W (n, k); returns y (M, n).

    y has x's dtype (fp16, bf16 or fp32) and is accumulated in fp32. For 16-bit x, W's dequantized
    values are rounded to x's dtype before the dot; fp32 x keeps them fp32 and the dot runs in full
    fp32 (no tf32). `out`, when given, is written in place and returned. Raises ValueError/TypeError
    naming the argument whose shape, dtype, type or device does not fit.
    """
    _check(x, w, out)
    m, n, k = x.shape[0], w.n, w.k
    cfg = config or default_config(w.qtype, m, n, k)
    if x.stride(1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    # Triton's interpreter (3.9) computes bf16 tl.dot wrongly and truncates fp32 -> bf16 casts; there
    # W is rounded to bf16 with integer ops and the dot runs in fp32 on the widened operands, which
    # gives the same (exact) products.
    bf16_as_f32 = x.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    precision = "ieee" if x.dtype == torch.float32 or bf16_as_f32 else None
    planes, strides = _kernel_args(w)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), cfg.split_k)
    split = cfg.split_k > 1
    ws = torch.empty(cfg.split_k, m, n, dtype=torch.float32, device=x.device) if split else out
    locks = split_locks(x.device, grid[0] if split else 1)  # unread without split-K
    quant_matmul_kernel[grid](
        x, out, ws, locks, *planes, m, n, k, x.stride(0), out.stride(0), *strides,
        QTYPE=kernel_type(int(w.qtype), w.layout),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, SWAP_AB=cfg.swap_ab, EVEN_K=k % cfg.block_k == 0, BF16_AS_F32=bf16_as_f32,
        PRECISION=precision, SPLIT_K=cfg.split_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        # No FMA contraction: d * q - dmin * mn must round as dequantize rounds it.
        enable_fp_fusion=False,
    )  # fmt: skip
    return out
