"""Launcher for the fused dequant + matvec kernels: y = x @ W^T with W kept as GGUF blocks.

x is (M, K) with 1 <= M <= MAX_M activation rows (decode, batched decode, speculative verification)
in fp16, bf16 or fp32; W is (N, K) in a GGUF quant type, either as the raw uint8 tensor of its stored
blocks, shape (N, K / block_size * type_size), or packed once by `pack_quant_weight`. y has x's
dtype; every product is accumulated in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from gguf.constants import GGMLQuantizationType

from strata.kernels._int8_x import Int8X
from strata.kernels._matvec_kquant import q4_k_matvec_kernel, q6_k_matvec_kernel
from strata.kernels._matvec_legacy import q4_0_matvec_kernel, q5_0_matvec_kernel, q8_0_matvec_kernel
from strata.kernels._matvec_lowbit import (
    codebook,
    iq2_s_matvec_kernel,
    iq2_xs_matvec_kernel,
    iq4_xs_matvec_kernel,
    q2_k_matvec_kernel,
)
from strata.kernels._matvec_q4k_planar import q4_k_planar_matvec_kernel
from strata.kernels.activation import gated_act
from strata.kernels.int8_inputs import ACTS, INT8_TYPES, int8_order, quantize_x
from strata.kernels.int8_matvec import int8_matvec, rows_matvec
from strata.kernels.kv_in_matvec import KVWrite
from strata.kernels.matvec_checks import check_flags
from strata.kernels.matvec_tiles import env_tile
from strata.kernels.pdl import launch_args
from strata.kernels.quant_pack import PackedQuantWeight, pack_quant_weight, rows_planes
from strata.kernels.split_locks import split_locks

_T = GGMLQuantizationType
MAX_M = 16
_X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Per type: the kernel and the K granularity of one loop unit (BLOCK_K must be a multiple of it).
_KERNELS = {
    _T.Q8_0: (q8_0_matvec_kernel, 32),
    _T.Q5_0: (q5_0_matvec_kernel, 32),
    _T.Q4_0: (q4_0_matvec_kernel, 32),
    _T.Q4_K: (q4_k_matvec_kernel, 64),
    _T.Q6_K: (q6_k_matvec_kernel, 128),
    _T.Q2_K: (q2_k_matvec_kernel, 128),
    _T.IQ4_XS: (iq4_xs_matvec_kernel, 32),
    _T.IQ2_XS: (iq2_xs_matvec_kernel, 8),
    _T.IQ2_S: (iq2_s_matvec_kernel, 8),
}
# Q4_K's planar layout (quant_pack): its own kernel, in whole 32-element sub-blocks.
_Q4_K_PLANAR = (q4_k_planar_matvec_kernel, 32)
_CODEBOOK_TYPES = (_T.IQ4_XS, _T.IQ2_XS, _T.IQ2_S)
MATVEC_TYPES: frozenset[GGMLQuantizationType] = frozenset(_KERNELS)


@dataclass(frozen=True)
class MatvecConfig:
    """Tile of one program: BLOCK_N output rows, BLOCK_K elements of K per loop step, K split in split_k.
    `prefetch` (Q4_K's planar kernels, fp32 and int8 x, and Q6_K's int8 one) issues each step's weight
    loads one step ahead (the same sums; with int8 x opt-in until timed). `int8_x` (Q4_K
    planar, Q6_K, Q8_0, Q5_0) quantizes x to int8 per 32 elements and multiplies with dp4a; None (the
    default) does so for fp16 / bf16 x of the types STRATA_INT8_X names (Q4_K planar and Q6_K unless set) and
    keeps fp32 x exact. `rows_at_once` (Q4_K's int8 kernel only) computes all M rows of a step by
    broadcasting instead of one after another: the same sums, bit for bit, with work linear in M
    (opt-in until timed; the other int8 kernels always work so). `flat_acc` (M = 1; Q4_K's int8
    kernel and Q5_0's fp32 one) keeps the accumulator in the layout of the step's products and reduces
    it once after the loop: Q4_K int8 saves a layout conversion per step, the same sums (its default,
    measured); Q5_0 three reductions per step, fp32 sums in another order (opt-in until timed).
    `scalar_scales` (Q4_K's and Q6_K's int8 kernels) loads the sub-block scales one per thread in the
    words' layout instead of vectorized, leaving out a layout conversion per step: the same sums
    (Q4_K's default where measured faster, Q6_K's opt-in until timed). `matched_loads` (M = 1, the
    fp32-x Q8_0 and Q5_0 kernels) runs `_matvec_legacy_matched`'s loop, every load in one thread
    layout and no conversion inside it: the same products summed in another order (with `preload`,
    the default of `env_tile`).
    `max_registers` caps the registers of a thread (Triton's `maxnreg`), so
    that more programs fit on an SM (the 8 x 2,048 Q4_K int8 tile takes 112, four programs of four
    warps; at 96, five, with no spills in its sm_90 build): the same sums (opt-in until timed).
    `paired_dm` (Q4_K's planar kernels, fp32 and int8 x) loads each super-block's d and dmin, side
    by side in their plane, as one 32-bit word instead of two 16-bit loads: four load instructions
    fewer per step of the 8 x 2,048 int8 tile (24 -> 20); the same values (opt-in until timed).
    `preload` (M = 1, the fp32-x Q8_0 and Q5_0 kernels, one K step a program: block_k * split_k >= k)
    loads and decodes the program's weights before `await_inputs`, so that under PDL they arrive while
    the kernel before runs and only x's load lies on the step's path; in Q4_K's and Q6_K's int8
    kernels (any M and steps) it runs `prefetch`'s loop with the first step's weights loaded before
    the wait. The same sums as the loop without it, bit for bit. With `matched_loads` the Q8_0 and
    Q5_0 kernels preload the matched loop's step (the matched loop's sums), so x's load after the
    wait needs no layout conversion: the default for one row (`env_tile`, STRATA_MATVEC_PRELOAD,
    measured 1.147x on the 0.5B's decode); the int8 preload lost (0.960x on the 1.5B).
    `lane_blocks` (the int8-x Q8_0 and Q5_0 kernels, 1-4 rows of x) puts a whole block in one lane
    instead of a half block (`_matvec_legacy_int8_blocks`): its loads once, no shared memory in the
    sum at 8 rows, an accumulator a row of x with no barrier at 2-4; the same products in another
    order (STRATA_INT8_LANE_BLOCKS; opt-in until timed)."""

    block_n: int = 16
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    prefetch: bool = False
    int8_x: bool | None = None
    rows_at_once: bool = False
    flat_acc: bool = False
    scalar_scales: bool = False
    matched_loads: bool = False
    max_registers: int | None = None
    paired_dm: bool = False
    preload: bool = False
    lane_blocks: bool = False

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"MatvecConfig.{name} must be a power of two, got {value}")
        if self.split_k < 1:
            raise ValueError(f"MatvecConfig.split_k must be >= 1, got {self}")
        if self.max_registers is not None and not 24 <= self.max_registers <= 255:
            raise ValueError(
                f"MatvecConfig.max_registers must be from 24 to 255 (a thread's), got {self.max_registers}"
            )

    def launch_options(self) -> dict[str, int]:
        """Triton launch options beyond the constexprs: the warps, and the register cap if set."""
        cap = {} if self.max_registers is None else {"maxnreg": self.max_registers}
        return {"num_warps": self.num_warps, **cap}


def auto_split_k(n: int, k: int, block_n: int, block_k: int, num_sms: int = 132) -> int:
    """K splits so that fewer row tiles than two per SM still fill the GPU (each split >= 2 steps)."""
    programs = triton.cdiv(n, block_n)
    if programs >= 2 * num_sms:
        return 1
    return max(1, min(8, triton.cdiv(2 * num_sms, programs), k // (2 * block_k)))


def default_config(
    qtype: GGMLQuantizationType, m: int, n: int, k: int, num_sms: int = 132, planar_int8: bool = False
) -> MatvecConfig:
    """The tile for one call: for M = 1, the best of benchmarks/gpu_matvec_graph.py's sweep on an H200
    (2026-12-03, inside CUDA graphs, the 0.5B and 7B decode shapes; benchmarks/notes/gpu_engine.md).

    At M = 1, 512 elements per step and 8 rows per program (more programs, each with more bytes in
    flight) beat the first guess by 1.1-1.6x; very tall matrices (gate+up, the output head) and
    long rows (7B down) want taller tiles; Q6_K keeps 256-element steps except on long rows. Tiny
    K (the 0.5B's 896) runs best with 8 warps. Q4_K's int8 kernel takes 8 x 2,048 tiles with its
    scales in the words' layout on weights of 2,048-65,535 rows (the 7B's, gate+up and down included).
    Wider batches keep the first guess, untuned: shorter steps so that M per-row partial products fit
    in registers. K is split by `auto_split_k`.
    """
    if m == 1 and planar_int8 and 2048 <= n < 65536:
        # Q4_K planar on int8 x, flat accumulator, scales loaded in the words' layout
        # (gpu_matvec_graph.py --int8-only, H200, 2026-12-04): 8 x 2,048 with 4 warps is the best tile
        # on each of the 7B's weights: q+k 6.21 us, q+k+v 6.99, o 6.14, gate+up 34.01 (16 x 512:
        # 37.19), down 23.13 (8 warps: 24.05). The scales' layout alone: 1.08-1.13x at that tile.
        split = auto_split_k(n, k, 8, 2048, num_sms)
        return MatvecConfig(8, 2048, split, 4, flat_acc=True, scalar_scales=True)
    if m == 1:
        block_n, block_k, warps = 8, 512, 8 if k <= 1024 else 4
        if n >= 65536:  # an output head: 150k rows
            block_n, block_k, warps = (32, 256, 4) if qtype in (_T.Q6_K, _T.Q4_K) else (64, 256, 4)
        elif qtype == _T.Q6_K:
            block_n, block_k = (32, 512) if k >= 8192 else (16, 256)
        elif n >= 16384 or k >= 16384:
            block_n = 16
        # Q4_K's int8 kernel adds its products to a flat accumulator at M = 1: the same sums, one
        # layout conversion per step fewer (faster at every default tile of the 7B sweep, e.g. gate+up
        # 38.3 us against 40.0). Its scales keep their vectorized loads here (the 0.5B's down, the
        # output heads): scalar_scales was not measured faster on them (0.5B decode 1.003x,
        # 0.882-1.125, H200, 2026-12-04).
        split = auto_split_k(n, k, block_n, block_k, num_sms)
        return MatvecConfig(block_n, block_k, split, warps, flat_acc=planar_int8)
    block_k = max(_KERNELS[qtype][1], 256 if m <= 4 else 128)
    return MatvecConfig(16, block_k, auto_split_k(n, k, 16, block_k, num_sms))


def _kernel_args(w: PackedQuantWeight, paired_dm: bool = False) -> tuple[list[torch.Tensor], list[int]]:
    if w.planar and w.layout == "rows":
        return rows_planes(w, paired_dm)
    if w.layout == "planar":
        # The int32 view of qs: one 16-byte load is one sub-block; with paired_dm, of dm too (d, dmin).
        qs, sc, mn, dm = w.planes
        planes = [qs.view(torch.int32), sc, mn, dm.view(torch.int32) if paired_dm else dm]
        return planes, [p.stride(0) for p in planes]
    if w.qtype == _T.Q4_K:
        (raw,) = w.planes
        # The fp16 view of the same bytes reads d and dmin without assembling bytes.
        return [raw, raw.view(torch.float16)], [raw.stride(0)]
    strides = [p.stride(0) for p in w.planes]
    if w.qtype in _CODEBOOK_TYPES:
        # The table pointer follows the planes; it has no stride.
        return [*w.planes, codebook(w.qtype, w.device)], strides
    return list(w.planes), strides


def quant_matvec(
    x: torch.Tensor,
    w: torch.Tensor | PackedQuantWeight,
    qtype: GGMLQuantizationType,
    n: int,
    k: int,
    *,
    out: torch.Tensor | None = None,
    config: MatvecConfig | None = None,
    bias: torch.Tensor | None = None,
    up: torch.Tensor | None = None,
    act: str = "silu",
    x_int8: dict[bool, Int8X] | None = None,
    kv: KVWrite | None = None,
) -> torch.Tensor:
    """y = x @ W^T (+ bias) for x (M, k) and a GGUF-quantized W (n, k); returns y (M, n) in x's dtype.

    `bias` (n,), any float dtype, is added to the fp32 sums before their one rounding to y's dtype.
    With `up` (like x), the input is the gated activation act(x) * up (`act` "silu" or "gelu_tanh", the
    values of `strata.kernels.activation`): computed inside x's int8 quantization where the int8 path
    runs, or (silu) inside the fp32 x loads of Q4_K's planar and Q6_K's kernels (no launch of its own),
    else by that module first. `x_int8`: x already quantized, by order
    (True planar), as `quantize_x` would (e.g. by `rms_norm_int8`); used where the int8 path runs.
    `kv`: y's rows are a decode step's q, k, v (as `kv.q_rows`, `kv.k_rows` say), stored rotated and
    written to the caches (`kv_in_matvec`; one row tile a program; the kernels `writes_kv` names).

    `w` is the raw uint8 tensor of the stored blocks (packed on every call: convenient, not fast) or a
    `PackedQuantWeight` from `pack_quant_weight` (pack once at load). `out`, when given, is written in
    place and returned. Raises ValueError/TypeError naming the argument whose shape, dtype or device
    does not fit.
    """
    if qtype not in _KERNELS:
        supported = ", ".join(t.name for t in sorted(MATVEC_TYPES))
        raise ValueError(f"no fused matvec for GGML type {qtype.name}; supported: {supported}")
    if isinstance(w, PackedQuantWeight):
        if (w.qtype, w.n, w.k) != (qtype, n, k):
            raise ValueError(
                f"packed weight is {w.qtype.name} ({w.n}, {w.k}), but the call says {qtype.name} ({n}, {k})"
            )
        packed = w
    else:
        packed = pack_quant_weight(w, qtype, n, k)
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be (M, {k}) for a weight with k={k}, got {tuple(x.shape)}")
    if up is not None:
        _check_gated(x, up, act)
    m = x.shape[0]
    if not 1 <= m <= MAX_M:
        raise ValueError(f"x has {m} rows; the fused matvec takes 1 to {MAX_M} (use a GEMM path for more)")
    if x.dtype not in _X_DTYPES:
        raise TypeError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if x.device != packed.device:
        raise ValueError(f"x is on {x.device} but the weight is on {packed.device}")
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1 or out.device != x.device:
        raise ValueError(
            f"out must be a ({m}, {n}) {x.dtype} tensor on {x.device} with contiguous rows, "
            f"got {tuple(out.shape)} {out.dtype} on {out.device} with strides {out.stride()}"
        )
    if bias is not None and (bias.shape != (n,) or bias.device != x.device or bias.stride(0) != 1):
        raise ValueError(f"bias must be a contiguous ({n},) tensor on {x.device}, got {tuple(bias.shape)}")
    if any(p.numel() >= 2**31 for p in packed.planes):
        raise ValueError(
            f"weight planes over 2 GiB are not supported (the kernels use int32 offsets): ({n}, {k})"
        )
    num_sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 132
    planar = packed.planar  # Q4_K's planar kernels: the "planar" and "rows" layouts
    by_default = x.dtype != torch.float32 and int8_order(packed) is not None
    cfg = config or default_config(qtype, m, n, k, num_sms, planar_int8=planar and by_default)
    kernel, unit = _Q4_K_PLANAR if planar else _KERNELS[qtype]
    if cfg.block_k % unit:
        raise ValueError(f"{qtype.name} needs block_k to be a multiple of {unit}, got {cfg.block_k}")
    if cfg.int8_x and not (planar or qtype in INT8_TYPES):
        raise ValueError(
            f"MatvecConfig.int8_x needs Q4_K's planar layout (STRATA_Q4K_LAYOUT=planar), Q6_K, Q8_0 or "
            f"Q5_0, not {qtype.name} ({packed.layout})"
        )
    int8_x = by_default if cfg.int8_x is None else cfg.int8_x
    extra: dict[str, object] = {}
    if up is not None and not int8_x:
        # SwiGLU inside the fp32 x loads of Q4_K (planar) and Q6_K (the same bits, no launch of its own).
        if (planar or qtype == _T.Q6_K) and act == "silu" and up.stride(0) == x.stride(0):
            extra |= {"up_ptr": up, "GATED": True}
        else:
            x, up = gated_act(x, up, act), None
    if cfg.preload and packed is not w:
        # Packed on this call: its planes are written by the kernels just launched, which a load
        # before the PDL wait could outrun.
        raise ValueError(
            "MatvecConfig.preload needs a weight packed once (pack_quant_weight), not raw blocks"
        )
    if config is None and packed is w:
        cfg = env_tile(cfg, packed, m, int8_x)
    check_flags(cfg, packed, int8_x, m)
    kv_args: dict[str, object] | None = None
    if kv is not None:
        path = _kv_path(packed, int8_x, own_tile=config is None)
        if path is None:
            raise ValueError(
                f"no K/V write in the matvec of {qtype.name} ({packed.layout}, int8 x {int8_x}): leave kv "
                "out and write with rotary_kv_write (see writes_kv)"
            )
        tile = packed.rows_group if path == "rows" else cfg.block_n
        kv_args = kv.kernel_args(out, tile, v_only=path == "rows")
    flat_q5_0 = qtype == _T.Q5_0 and not int8_x
    if qtype == _T.Q6_K and packed.layout == "rows" and int8_x and config is not None:
        raise ValueError(
            "Q6_K's rows layout multiplies int8 x with its own kernel and launch (q6k_rows_config): "
            "pass config=None, or pack the weight with q6k_layout='blocks' to launch with a MatvecConfig"
        )
    if planar:
        extra["PREFETCH"] = cfg.prefetch
        extra["PAIRED_DM"] = cfg.paired_dm
        extra["ROWS"] = packed.rows_group
    elif qtype == _T.Q6_K and not int8_x:
        extra["ROWS"] = packed.rows_group
    elif flat_q5_0:
        extra["FLAT_ACC"] = cfg.flat_acc
    if cfg.matched_loads:
        extra["MATCHED"] = True
    if cfg.preload:
        extra["PRELOAD"] = True
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k)
    # Split-K partials go to an fp32 workspace (rows as far apart as out's) that the last split of each
    # row tile sums in split order: deterministic, unlike atomic adds, and no launch of its own.
    ws = (
        out
        if cfg.split_k == 1
        else torch.empty(cfg.split_k, m, out.stride(0), dtype=torch.float32, device=x.device)
    )
    stride_ys = 0 if cfg.split_k == 1 else ws.stride(0)
    locks = split_locks(x.device, grid[0] if cfg.split_k > 1 else 1)  # unread without split-K
    dest = (ws, out, locks, out if bias is None else bias)
    tensors, strides = _kernel_args(packed, cfg.paired_dm)
    if int8_x:
        ready = None if x_int8 is None or up is not None else x_int8.get(planar)
        xq = ready if ready is not None else quantize_x(x, planar=planar, up=up, act=act)
        if packed.layout == "rows" and config is None:
            rows_matvec(xq, packed, out, bias, num_sms, kv_args)
            return out
        int8_matvec(
            qtype, xq, dest, bias is not None, tensors, strides, grid, n, k, stride_ys, cfg,
            packed.rows_group, kv_args,
        )  # fmt: skip
    else:
        kernel[grid](
            x, *dest, *tensors, n, k, x.stride(0), stride_ys, out.stride(0), *strides,
            M=m, M_PAD=triton.next_power_of_2(m), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            SPLIT_K=cfg.split_k, HAS_BIAS=bias is not None, **cfg.launch_options(), **extra,
            **(kv_args or {}), **launch_args(x.device),
        )  # fmt: skip
    return out


def writes_kv(w: PackedQuantWeight, x_dtype: torch.dtype, rotates: bool, head_dim: int) -> bool:
    """Whether `quant_matvec(x, w, ..., kv=...)` can write K/V in its store for rows of x_dtype:
    rows of q or k (`rotates`) in Q5_0's and Q8_0's kernels (fp32 and int8 x) and Q4_K's planar int8 kernel,
    for heads of a multiple of 16 (the default row tiles of 8 and 16 then hold whole pairs), rows of
    v also in Q6_K's rows kernel."""
    path = _kv_path(w, x_dtype != torch.float32 and int8_order(w) is not None, own_tile=True)
    return (path == "tile" and not (rotates and head_dim % 16)) or (path == "rows" and not rotates)


def _kv_path(w: PackedQuantWeight, int8_x: bool, own_tile: bool) -> str | None:
    """The kernel that takes a K/V write for w: "tile" (one taking `kv_tile_rows`), "rows" (Q6_K's
    rows kernel: v's rows only), None (none); `own_tile`: no MatvecConfig given."""
    if int8_x and w.layout == "rows" and own_tile:
        return None if w.planar else "rows"
    return "tile" if w.qtype in (_T.Q5_0, _T.Q8_0) or (int8_x and w.planar) else None


def _check_gated(x: torch.Tensor, up: torch.Tensor, act: str) -> None:
    if act not in ACTS:
        raise ValueError(f"act must be one of {', '.join(ACTS)}, got {act!r}")
    if up.shape != x.shape or up.dtype != x.dtype or up.device != x.device or up.stride(1) != 1:
        raise ValueError(
            f"up must be a {tuple(x.shape)} {x.dtype} tensor on {x.device} with contiguous rows like x, "
            f"got {tuple(up.shape)} {up.dtype} on {up.device} with strides {up.stride()}"
        )
