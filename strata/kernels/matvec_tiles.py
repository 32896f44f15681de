"""The tile a one-row decode matvec runs when its caller names none, beyond `default_config`'s:
STRATA_MATVEC_PRELOAD's one-step tiles whose weights are loaded before the PDL wait
(`MatvecConfig.preload`, with `matched_loads` by default), and STRATA_SPLIT_ONE_STEP's one
preloaded step a split on short int8 weights."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import triton
from gguf.constants import GGMLQuantizationType

from strata import env
from strata.kernels.matvec_checks import program_steps

if TYPE_CHECKING:
    from strata.kernels.quant_matvec import MatvecConfig
    from strata.kernels.quant_pack import PackedQuantWeight

_T = GGMLQuantizationType
# STRATA_SPLIT_ONE_STEP applies to int8 weights of fewer row tiles than this (two per SM of an H100):
# the 0.5B's Q4_K down (112 tiles of 8 rows) and the 1.5B's o (192), not the 7B's weights (448 and more).
# (Q6_K's default "rows" layout and Q4_K's "rows", the 1.5B's down among them, run kernels of their own.)
SPLIT_ONE_STEP_BELOW = 264


def env_tile(cfg: MatvecConfig, w: PackedQuantWeight, m: int, int8_x: bool) -> MatvecConfig:
    """The tile a launch without a config runs for `m` rows of x by `w` (packed once), from
    `default_config`'s `cfg`: STRATA_SPLIT_ONE_STEP's `split_one_step` where that applies, else
    STRATA_MATVEC_PRELOAD's `preload_tile`, for one row; for 2-4 rows, STRATA_INT8_LANE_BLOCKS's
    layout in the int8 Q8_0 and Q5_0 kernels."""
    if m != 1:
        lanes = int8_x and w.qtype in (_T.Q8_0, _T.Q5_0) and m <= 4 and env.int8_lane_blocks()
        return replace(cfg, lane_blocks=True) if lanes else cfg
    if int8_x and env.split_one_step() and splits_to_one_step(cfg, w):
        return replace(cfg, split_k=triton.cdiv(w.k, cfg.block_k), preload=True)
    preload = env.matvec_preload()
    if preload == "0":
        return cfg
    return preload_tile(cfg, w, int8_x, matched=preload == "matched")


def preload_tile(
    cfg: MatvecConfig, w: PackedQuantWeight, int8_x: bool, matched: bool = False
) -> MatvecConfig:
    """`cfg` as STRATA_MATVEC_PRELOAD runs it for one row of x by `w`: with fp32 x, a Q8_0 or Q5_0
    weight of K up to 2,048 takes K in one step, preloaded (`matched`: with matched loads), where that
    tile holds at most 8 x 2,048 weights (not an output head's 64-row tiles); with int8 x, unless
    `matched`, Q4_K's planar and Q6_K's kernels preload where the tile takes K in one step (the 1.5B's
    K = 1,536 at 8 x 2,048; 0.960x on the 1.5B, H100), and with `matched` Q8_0's and Q5_0's dp4a
    kernels take `int8_legacy_tile`. Any other weight keeps `cfg`."""
    legacy = w.qtype in (_T.Q8_0, _T.Q5_0)
    if int8_x and legacy:
        return int8_legacy_tile(cfg, w) if matched else cfg
    if int8_x:  # (the "rows" layouts run kernels of their own, which take no MatvecConfig)
        one_step = (w.planar or w.qtype == _T.Q6_K) and w.layout != "rows" and program_steps(cfg, w.k) <= 1
        return replace(cfg, preload=True) if one_step and not matched else cfg
    block_k = max(cfg.block_k, triton.next_power_of_2(w.k))
    # At most 8 x 2,048 weights a program: a thread holds them all, decoded, across the wait.
    if not legacy or w.k > 2048 or cfg.block_n * block_k > 8 * 2048:
        return cfg
    # 8 warps: the measured best at K = 896 (8 x 1,024); at 8 x 2,048 a thread of 4 warps would hold
    # 128 decoded weights (168 registers in the sm_90 build of Q5_0's, 105 at 8 warps).
    return replace(
        cfg, block_k=block_k, split_k=1, num_warps=8, preload=True, matched_loads=matched, flat_acc=False
    )


def int8_legacy_tile(cfg: MatvecConfig, w: PackedQuantWeight) -> MatvecConfig:
    """Q8_0's and Q5_0's dp4a kernel for one row of x: the matched loop, and where K fits one step of up
    to 2,048, that step at 8 rows, preloaded (8 warps; 4 on an output head's 65,536 rows and more).
    Measured (`gpu_matvec_graph.py --int8-ready`, H100, 2026-12-07; the 0.5B's weights, us a call in
    graphs, against the fp32 matched preloaded step): gate+up 4.64 (6.88), q+k+v 1.41 (1.71), o 1.35
    (1.56), the Q8_0 v 1.22 (1.56), the Q8_0 output head 49.8 at 4 warps (62.4 at the fp32 default
    tile). Longer rows: the matched loop at 8 x 512 with 8 warps, the best tile on three of the 7B's
    four weights in a Q8_0 file (the same run: q+k+v 11.91 us against 12.31 at the fp32 default tile,
    o 7.82 against 10.46, gate+up 54.56 against 59.52, down 32.73 against 42.07). The matched loop beat
    the plain int8 one at every weight timed. Rows of x beyond one (batched decode) keep the plain
    int8 loop, untimed on these types (it has half the fp32 kernels' barriers in its loop at M = 3).
    STRATA_INT8_LANE_BLOCKS: either tile with a whole block a lane (`MatvecConfig.lane_blocks`), the
    longer rows' loop at 8 x 1,024 (at 8 x 512 with 8 warps half of a block's words go to each of two
    lanes: 83 instructions a thread a step for 16 weights in the sm_90 build of Q5_0's, against 109
    for 32 at 8 x 1,024; untimed)."""
    from strata.kernels.quant_matvec import auto_split_k  # (quant_matvec imports this module)

    lanes = env.int8_lane_blocks()
    if w.k > 2048:
        block_k = 1024 if lanes else 512
        split = auto_split_k(w.n, w.k, 8, block_k)
        return replace(
            cfg, block_n=8, block_k=block_k, split_k=split, num_warps=8, matched_loads=True, flat_acc=False,
            lane_blocks=lanes,
        )  # fmt: skip
    return replace(
        cfg, block_n=8, block_k=triton.next_power_of_2(w.k), split_k=1, num_warps=4 if w.n >= 65536 else 8,
        preload=True, matched_loads=True, flat_acc=False, lane_blocks=lanes,
    )  # fmt: skip


def splits_to_one_step(cfg: MatvecConfig, w: PackedQuantWeight) -> bool:
    """Whether STRATA_SPLIT_ONE_STEP splits `w`'s K so that each program of `cfg`'s tile takes one
    step, its weights loaded before the PDL wait: Q4_K's planar and Q6_K's int8 kernels (the kernels
    whose preload takes any split), on weights of fewer row tiles than SPLIT_ONE_STEP_BELOW, where
    `default_config`'s few splits leave each program several steps one after another. The 0.5B's Q4_K
    down (896 x 4,864) runs 112 tiles of 8 x 512 split 3 with 4 warps, four steps a program: about 0.7
    MB of loads in flight at a time for 3.6 MB, near the 5.4 us it takes at ~1 us a round trip; split
    10, 1,120 programs of one step put all of it in flight at once."""
    kernel = (w.planar or w.qtype == _T.Q6_K) and w.layout != "rows"
    return kernel and triton.cdiv(w.n, cfg.block_n) < SPLIT_ONE_STEP_BELOW and program_steps(cfg, w.k) > 1
