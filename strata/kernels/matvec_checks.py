"""Which `MatvecConfig` options each fused matvec kernel implements: a launch asking for one that
its kernel lacks is refused with the option named, rather than run with the option silently off."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gguf.constants import GGMLQuantizationType

if TYPE_CHECKING:
    from strata.kernels.quant_matvec import MatvecConfig
    from strata.kernels.quant_pack import PackedQuantWeight

_T = GGMLQuantizationType


def check_flags(cfg: MatvecConfig, packed: PackedQuantWeight, int8_x: bool, m: int) -> None:
    """Raise ValueError naming the first option of `cfg` that the kernel for `m` rows of x (quantized
    to int8 or not) times `packed` does not implement."""
    qtype, layout, planar = packed.qtype, packed.layout, packed.planar
    if cfg.prefetch and not (planar or (int8_x and qtype == _T.Q6_K)):
        raise ValueError(
            f"MatvecConfig.prefetch needs Q4_K's planar layout (STRATA_Q4K_LAYOUT=planar) or Q6_K with "
            f"int8_x, not {qtype.name} ({layout}) with int8_x={int8_x}"
        )
    if cfg.rows_at_once and not (int8_x and planar):
        raise ValueError("MatvecConfig.rows_at_once is implemented in the int8_x kernel only")
    flat_q5_0 = qtype == _T.Q5_0 and not int8_x
    what = f"{qtype.name} ({layout}) with int8_x={int8_x}, rows_at_once={cfg.rows_at_once}"
    if cfg.scalar_scales and not (int8_x and (planar or qtype == _T.Q6_K)):
        raise ValueError(
            f"MatvecConfig.scalar_scales is implemented in Q4_K's and Q6_K's int8_x kernels only, not "
            f"{what}: leave it off, or use Q4_K's planar layout or Q6_K with int8_x"
        )
    if cfg.flat_acc and not (m == 1 and not cfg.rows_at_once and ((int8_x and planar) or flat_q5_0)):
        raise ValueError(
            "MatvecConfig.flat_acc is implemented for one row of x in Q4_K's int8_x kernel and Q5_0's fp32"
        )
    if cfg.matched_loads and not (m == 1 and qtype in (_T.Q8_0, _T.Q5_0) and not cfg.flat_acc):
        raise ValueError(
            "MatvecConfig.matched_loads is implemented for one row of x in the Q8_0 and Q5_0 kernels "
            f"(not with flat_acc), not {m} rows of {qtype.name} with int8_x={int8_x}, "
            f"flat_acc={cfg.flat_acc}: leave it off there"
        )
    if cfg.lane_blocks and not (int8_x and qtype in (_T.Q8_0, _T.Q5_0) and m <= 4):
        raise ValueError(
            "MatvecConfig.lane_blocks is a layout of the int8_x Q8_0 and Q5_0 kernels for up to 4 rows of "
            f"x, not {m} rows of {qtype.name} with int8_x={int8_x}: leave it off there, or give int8_x=True"
        )
    if cfg.paired_dm and not planar:
        raise ValueError(
            f"MatvecConfig.paired_dm is implemented in Q4_K's planar kernels only, not {qtype.name} "
            f"({layout}): leave it off, or use STRATA_Q4K_LAYOUT=planar"
        )
    if cfg.preload:
        _check_preload(cfg, packed, int8_x, m)


def _check_preload(cfg: MatvecConfig, packed: PackedQuantWeight, int8_x: bool, m: int) -> None:
    qtype, layout = packed.qtype, packed.layout
    if int8_x and (packed.planar or qtype == _T.Q6_K):
        return  # Q4_K's and Q6_K's int8 kernels: PREFETCH's loop, any rows and steps
    where = f"{m} rows of {qtype.name} ({layout}) with int8_x={int8_x}"
    if not (m == 1 and qtype in (_T.Q8_0, _T.Q5_0)):
        raise ValueError(
            "MatvecConfig.preload is implemented in Q4_K's and Q6_K's int8_x kernels and, for one row of "
            f"x, in the Q8_0 and Q5_0 kernels; not {where}: leave it off there"
        )
    if int8_x and not (cfg.matched_loads or cfg.lane_blocks):
        raise ValueError(
            f"MatvecConfig.preload in the int8_x {qtype.name} kernel runs the matched or the lanes' step: "
            "give matched_loads=True or lane_blocks=True too"
        )
    steps = program_steps(cfg, packed.k)
    if steps > 1:
        raise ValueError(
            f"MatvecConfig.preload in the {qtype.name} kernel needs one K step a program, not {steps:.2f} "
            f"(k={packed.k} split {cfg.split_k} ways, block_k={cfg.block_k}): give block_k * split_k >= k"
        )
    if cfg.flat_acc:
        raise ValueError("MatvecConfig.preload runs the plain or the matched loop: not with flat_acc")


def program_steps(cfg: MatvecConfig, k: int) -> float:
    """The K steps of a program's loop at `cfg` (a fraction: its last step's share), 32-element
    units split `cfg.split_k` ways."""
    return -(-(k // 32) // cfg.split_k) / (cfg.block_k // 32)
