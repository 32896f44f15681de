"""Every STRATA_* environment variable, declared in one place and read only here."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path


def strata_home() -> Path:
    """STRATA_HOME: where assembled models live (default: the user's cache directory)."""
    explicit = os.environ.get("STRATA_HOME")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "strata"


def num_threads() -> int | None:
    """STRATA_NUM_THREADS: torch intra-op threads on the CPU (default: torch's own choice)."""
    value = os.environ.get("STRATA_NUM_THREADS")
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"STRATA_NUM_THREADS={value!r} is not a positive integer; unset it or set e.g. 2")
    return int(value)


def triton_on_cpu() -> bool:
    """STRATA_TRITON_ON_CPU=1: models built on the CPU take the GPU's kernel path (Triton kernels run
    in Triton's interpreter, which also needs TRITON_INTERPRET=1). For tests of that path without a GPU."""
    return os.environ.get("STRATA_TRITON_ON_CPU", "") not in ("", "0")


# The layouts quant_pack packs Q4_K and Q6_K weights in (its module docstring describes them).
Q4K_LAYOUTS = ("blocks", "planar", "rows", "auto")
Q6K_LAYOUTS = ("blocks", "rows")


def q4k_layout() -> str:
    """STRATA_Q4K_LAYOUT: how Q4_K weights are packed for the GPU kernels, "blocks" (the GGUF blocks
    as stored), "planar", "rows" or "auto" (see strata.kernels.quant_pack). "rows" regroups the planar
    planes by 64 rows for an int8 decode matvec whose lanes each take a row of one super-block
    (`kernels._matvec_q4k_rows`, up to STRATA_MATVEC_ROWS sequences); the other paths (fp32 x, the
    fused matmul, dequantization) read it with the planar kernels. "auto", the default, packs the
    weights large enough for that kernel to gain as "rows" and the rest as "planar"
    (`quant_pack.ROWS_FROM`, `ROWS_FROM_K`): against "planar" (H100, 2026-12-06, `strata bench ab
    strata:q4k_layout=planar strata:q4k_layout=auto`) the 7B decoded 1.050x at one sequence, 1.163x
    at 2, 1.425x at 4, 0.999x at 8, 1.029x at 64, prefilled 2,048 tokens 1.014x, and the 1.5B decoded
    1.038x (benchmarks/RESULTS.md); the 0.5B's weights are all planar either way."""
    value = os.environ.get("STRATA_Q4K_LAYOUT", "") or "auto"
    if value not in Q4K_LAYOUTS:
        raise ValueError(
            f"STRATA_Q4K_LAYOUT={value!r} is not a layout; set blocks, planar, rows or auto, or unset it"
        )
    return value


def q6k_layout() -> str:
    """STRATA_Q6K_LAYOUT: how Q6_K weights are packed for the GPU kernels, "rows" (the default: the
    planes of `quant_pack` regrouped by 64 rows for the int8 decode matvec of `kernels._matvec_q6k_rows`,
    whose warps take 32 rows of one half super-block; the other paths read it through `_bits.row_at`;
    7B decode 1.06x at one sequence, 1.09x at 64 on an H100) or "blocks" (those planes by row)."""
    value = os.environ.get("STRATA_Q6K_LAYOUT", "") or "rows"
    if value not in Q6K_LAYOUTS:
        raise ValueError(f"STRATA_Q6K_LAYOUT={value!r} is not a layout; set blocks or rows, or unset it")
    return value


def kernel_row_limits() -> tuple[int, int]:
    """STRATA_MATVEC_ROWS (default 4, at most 16) and STRATA_DENSE_ROWS (default 64): on the GPU
    kernel path, up to MATVEC_ROWS activation rows go through the fused matvec, fewer than DENSE_ROWS
    through the fused tensor-core matmul, and from DENSE_ROWS on the weight is dequantized for cuBLAS
    (strata.layers.linear). Knobs for measuring the crossovers (`strata bench ab` arm options); the
    defaults are the measured ones (H200, 2026-12-04, benchmarks/RESULTS.md): on the 7B, 4 rows ran
    faster through the matvec (matmul 0.91x), 8 and 16 through the matmul (2.08x, 4.16x), and 64
    through cuBLAS (the matmul 0.96x then; since its tiles by shape, wide weights such as gate+up keep
    the matmul at 64 rows: `strata.layers.linear.WIDE_ROWS`)."""
    matvec = _integer("STRATA_MATVEC_ROWS", 4, 1)
    dense = _integer("STRATA_DENSE_ROWS", 64, 1)
    if matvec > 16 or dense <= matvec:
        raise ValueError(
            f"STRATA_MATVEC_ROWS={matvec} must be at most 16 (the matvec's limit) and below "
            f"STRATA_DENSE_ROWS={dense}; unset them for 4 and 64"
        )
    return matvec, dense


def copy_rows(matvec_rows: int) -> int:
    """STRATA_COPY_ROWS (default `matvec_rows` + 1, i.e. 5): on the GPU kernel path, batches of this
    many rows or more multiply a weight's dense copy (STRATA_DENSE_COPY, STRATA_DENSE_WIDE) with cuBLAS;
    fewer go through the fused matvec (up to STRATA_MATVEC_ROWS) or the fused matmul. Weights without a
    copy keep STRATA_DENSE_ROWS. Measured (H100, 2026-12-06, `strata bench ab strata
    strata:dense_rows=N` when that knob set the copies' threshold too): the fused matmul between 5 and
    48 rows ran at 0.53-0.77x of cuBLAS on the copy, e.g. the 7B 1.46x at 5 sequences, 1.46x at 8, 1.43x
    at 16, 1.51x at 32, 1.88x at 48; the 1.5B 1.41x at 5 and 16; the 0.5B 1.31x at 5, 1.48x at 8, 1.53x
    at 32. Below it the matvec: cuBLAS at 4 rows ran 0.706x on the 7B, the matvec at 5-8 rows 0.65x."""
    rows = _integer("STRATA_COPY_ROWS", matvec_rows + 1, 1)
    if rows <= matvec_rows:
        raise ValueError(
            f"STRATA_COPY_ROWS={rows} must be above STRATA_MATVEC_ROWS={matvec_rows} (the matvec takes up "
            f"to that many rows); unset it for {matvec_rows + 1}"
        )
    return rows


def act_in_quant() -> bool:
    """STRATA_ACT_IN_QUANT (default 1): on the GPU kernel path, a gated activation (SwiGLU, GeGLU)
    feeding an int8 matvec (decode's down projection) is computed inside x's int8 quantization, the
    same values bit for bit, instead of by a launch of its own (one launch fewer per layer and step;
    H200, 2026-12-04: 7B decode 1.015x at one and at eight sequences, 0.5B 0.98-1.01x, within its
    noise). With int8 x off for the weight's type (STRATA_INT8_X), Q4_K's planar and Q6_K's fp32-x
    matvecs compute a SwiGLU as they load x instead (the same bits; untimed). 0 launches the activation
    on its own."""
    return _level("STRATA_ACT_IN_QUANT", "1", ("0", "1")) == "1"


def quant_in_norm() -> bool:
    """STRATA_QUANT_IN_NORM (default 1): on the GPU kernel path, an RMSNorm whose output feeds int8
    matvecs (decode's q/k/v and gate/up projections, up to STRATA_MATVEC_ROWS rows) also quantizes that
    output to int8, in each order its consumers read, in its own launch (`kernels.rms_norm_int8`): the
    same values bit for bit, one launch fewer per order (the 7B: three per layer; H200, 2026-12-04:
    7B decode 1.028x at one sequence, 1.002x at eight, which it leaves alone). 0 quantizes in the
    matvecs' own `quantize_x` launches."""
    return _level("STRATA_QUANT_IN_NORM", "1", ("0", "1")) == "1"


def quant_in_merge() -> bool:
    """STRATA_QUANT_IN_MERGE (default 1): on the GPU kernel path, the merge kernel of decode attention
    also quantizes each head's output to int8 for an o projection that multiplies int8 x (Q4_K, as in
    the 1.5B and 7B; up to STRATA_MATVEC_ROWS rows), as STRATA_QUANT_IN_NORM does for the norms'
    consumers: the same values bit for bit, the o projection's `quantize_x` launch fewer where a merge
    kernel runs (more than one split). Measured (H100, 2026-12-07, decode of one sequence, the same
    ids): 1.5B 1.010x (swapped 1.026x), 7B 0.998x (swapped 1.007x). 0 quantizes in the o projection's
    own launch."""
    return _level("STRATA_QUANT_IN_MERGE", "1", ("0", "1")) == "1"


def rope_in_matvec() -> bool:
    """STRATA_ROPE_IN_MATVEC (default 1): on the GPU kernel path, a decode step of up to
    STRATA_MATVEC_ROWS rows rotates q and k and writes K and V to the cache in the store of the q, k,
    v projections' matvecs (`kernels.kv_in_matvec`; where each of them takes it: Q5_0, Q8_0, Q4_K
    planar on int8 x, Q6_K rows for v; the whole head rotated; not Qwen3's QK-norm) instead of
    `rotary_kv_write`'s launch: the same bits, one launch fewer per layer. Measured (H100,
    2026-12-07, decode of one sequence, the same ids): 0.5B 1.006x, 1.5B 1.017x, 7B 1.001x. 0: the
    rotary kernel launches."""
    return _level("STRATA_ROPE_IN_MATVEC", "1", ("0", "1")) == "1"


def matvec_preload() -> str:
    """STRATA_MATVEC_PRELOAD: on the GPU kernel path, how a decode matvec of one row of 16/32-bit x by
    a Q8_0 or Q5_0 weight of K up to 2,048 (the 0.5B's q/k/v, o and gate/up; not the output head)
    runs. matched (the default): all of K in one step, its weights loaded and decoded before the PDL
    wait (`MatvecConfig.preload`) and x loaded in the weights' thread layout (`matched_loads`), so
    that only x's load, the products and the sums follow the kernel before (fp32 sums in another order
    than 0's). 1: preloaded without matched loads, and Q4_K's and Q6_K's int8 matvecs preloaded where
    the default tile takes K in one step (the 1.5B's K of 1,536 at 8 x 2,048): the same sums as 0's.
    0: the tiles of `default_config`. Measured (H100, 2026-12-07, decode of one sequence against 0):
    0.5B matched 1.147x, 1 1.137x; 1.5B 1 0.960x."""
    return _level("STRATA_MATVEC_PRELOAD", "matched", ("0", "1", "matched"))


def int8_lane_blocks() -> bool:
    """STRATA_INT8_LANE_BLOCKS=1 (opt-in until timed): on the GPU kernel path, the int8-x Q8_0 and Q5_0
    matvecs for one to four rows of x put a whole block in a lane instead of half of one
    (`int8_legacy_tile`, `MatvecConfig.lane_blocks`): about a quarter fewer instructions a thread at
    one row, no barrier in the loop at 2-4. The same products, summed in another order."""
    return _level("STRATA_INT8_LANE_BLOCKS", "0", ("0", "1")) == "1"


def split_one_step() -> bool:
    """STRATA_SPLIT_ONE_STEP=1 (opt-in until timed): on the GPU kernel path, an int8 Q4_K (planar) or
    Q6_K (blocks) matvec of one row of x whose default tile makes fewer than two row tiles an SM
    splits K until each program takes one step, its weights loaded before the PDL wait
    (`matvec_tiles.splits_to_one_step`: the 0.5B's Q4_K down, 1,120 programs of one step instead of
    336 of four). The same products, split-K sums in another order."""
    return _level("STRATA_SPLIT_ONE_STEP", "0", ("0", "1")) == "1"


def q6k_halves() -> int:
    """STRATA_Q6K_HALVES (opt-in until timed; default 0, at most 64): on the GPU kernel path, how many
    128-element halves of a super-block a program of Q6_K's row-interleaved int8 matvec takes (K split
    into that many halves a split); 0: `q6k_rows_config`'s rule, splits in powers of two up to 32. On
    the 0.5B's down (38 halves), that rule runs 19 programs of two halves a row group (and 13 empty),
    1 runs 38 of one, each walking one half: for its 7.5 % occupancy in Nsight Compute (H100)."""
    return _integer("STRATA_Q6K_HALVES", 0, 0, 64)


def rows_preload() -> bool:
    """STRATA_ROWS_PRELOAD=1 (opt-in, measured no faster): on the GPU kernel path, the row-interleaved int8
    matvecs (`_matvec_q4k_rows`: the 7B's Q4_K gate+up and down, the 1.5B's down; `_matvec_q6k_rows`:
    the Q6_K weights, the 7B's output head among them) load their first step's weights before the PDL
    wait, while the kernel before them runs, as the fp32 Q8_0/Q5_0 matvecs do under
    STRATA_MATVEC_PRELOAD (`RowsConfig.preload`, `Q6KRowsConfig.preload`). The same sums. Their
    launches split K up to 32 ways, so the first step is from a quarter to all of a program's weights
    (the 7B's down: 3-4 super-blocks a program). Measured (H100, 2026-12-07, decode): the 7B 0.994x
    (arms swapped 1.002x), the 1.5B 0.988x (swapped 0.966x), the 7B at 8 sequences 0.991x."""
    return _level("STRATA_ROWS_PRELOAD", "0", ("0", "1")) == "1"


def widen_to_stack() -> bool:
    """STRATA_WIDEN_TO_STACK=1 (opt-in until timed): on the GPU kernel path, projections of one input
    whose weights are Q5_0 and Q8_0 (the 0.5B's q+k and v in half its layers) are stacked into one
    launch after rewriting the Q5_0 blocks as Q8_0 blocks of the same values (`quant_pack.widen_q5_0`:
    34 bytes a block instead of 22, about 0.34 MB more per such 0.5B layer) instead of launching
    each type apart. The same weights; the Q8_0 kernel sums a block's 32 products in another order
    than the Q5_0 kernel's two halves (fp32 rounding apart, the same values). Measured neutral (H100,
    2026-12-05): 0.5B decode 0.996x."""
    return _level("STRATA_WIDEN_TO_STACK", "0", ("0", "1")) == "1"


def live_splits() -> bool:
    """STRATA_LIVE_SPLITS=1 (opt-in until timed): the GPU's paged decode attention runs, of the split
    count fixed on the host (for the longest context a captured graph allows), at most one split per
    256 positions of each sequence's context (counted on the device): short contexts then take one
    split and skip the merge. 0: the splits partition every context as the host's count says (at
    most one per position), the merge reading them all. The same bits within one tile (64 positions);
    beyond, one split's running softmax against a merge of several partials: fp32 rounding apart (on
    an H100, 1 bf16 ulp at 65-256 positions, `benchmarks/split_bits.py`; a synthetic 7B's greedy ids
    then part after 11 tokens). Measured (H100, 2026-12-05): 0.5B decode 1.013x, 7B 0.957x."""
    return _level("STRATA_LIVE_SPLITS", "0", ("0", "1")) == "1"


def attention_prefetch() -> int:
    """STRATA_ATTENTION_PREFETCH (the kernels' PREFETCH_KV level): tile (2, the default), each paged
    decode attention split loads its first tile's K and V into registers before it waits for the
    kernel before it (under PDL), as the preloaded matvecs do their weights, all but the new token's
    row (written by the step, so loaded after the wait); 1, under PDL level 2, it only asks L2 for those
    rows; 0, it loads nothing before the wait. The same bits at every level. Measured against 0 (H100,
    2026-12-07, decode, `strata bench ab`): the 7B 1.022x and, arms swapped, 1.013x at one sequence,
    1.002x at 8, 1.009x at 64; the 1.5B 1.075x and 1.010x swapped; the 0.5B 1.006x and 1.000x swapped,
    0.995x at 8, 1.003x at 32k positions. Level 1 against tile on the 7B: 0.988x (H100, 2026-12-07)."""
    return {"0": 0, "1": 1, "tile": 2}[_level("STRATA_ATTENTION_PREFETCH", "tile", ("0", "1", "tile"))]


def dense_copy() -> str:
    """STRATA_DENSE_COPY (default auto; 0 or 1 for never or always): on the GPU kernel path each quantized
    weight of fewer than 16,384 outputs (the 7B's q, k, v, o and down; wider ones as `dense_wide` says)
    also keeps a dequantized copy in the compute dtype, which batches of STRATA_COPY_ROWS rows or more
    multiply with cuBLAS directly instead of dequantizing the weight on every call (the same values;
    batches below 64 rows, which the fused matmul took, now round as cuBLAS does: which path a weight
    takes then depends on whether it keeps a copy, i.e. under `auto` on the memory free at load),
    more memory (the 7B: about 5.4 GB in bf16) for less traffic per batched step (2 bytes a weight read
    instead of about 4.6 read and written). `auto` keeps a copy where the GPU keeps half its memory free
    after it (`strata.layers.linear.DENSE_COPY_FREE_SHARE`). `strata bench ab strata
    strata:dense_copy=1` (H100, 2026-12-06, the same ids): 64 sequences 1.362x (7B), 1.165x (1.5B),
    1.081x (0.5B); prefill of 2,048 1.052x (7B), 1.105x (0.5B)."""
    return _level("STRATA_DENSE_COPY", "auto", ("auto", "0", "1"))


def dense_wide() -> str:
    """STRATA_DENSE_WIDE (default auto; 0 or 1 for none or all): which wide weights (16,384 outputs or
    more: the output head, the 7B's gate+up) STRATA_DENSE_COPY covers too. A wide weight with a copy
    multiplies batches of STRATA_COPY_ROWS rows or more with cuBLAS instead of the fused matmul. `auto`
    takes those of the types whose fused matmul is bound by decoding them, not by their bytes (all but
    `strata.layers.linear.CHEAP_DECODE`: Q4_0, Q5_0, Q8_0). Measured (H100, 2026-12-06, `strata bench ab`,
    64 sequences, the same ids): the 7B's gate+up copied 1.025x (its prefill of 2,048 1.048x), its Q6_K
    head on top 1.060x (9,023 tok/s); the 1.5B's Q6_K head 1.096x; the 0.5B's Q8_0 head 0.974x (a noisy
    0.78-1.10). The copies cost the 7B 8.7 GB (gate+up 7.6, the head 1.1), the 1.5B 0.47 GB."""
    return _level("STRATA_DENSE_WIDE", "auto", ("auto", "0", "1"))


def dense_stack() -> bool:
    """STRATA_DENSE_STACK (default 1; 0 for off): projections of one input whose parts all keep dense
    copies (q+k and v of other quant types, as in the 1.5B and 7B) multiply batches of STRATA_COPY_ROWS
    rows or more as one cuBLAS matmul over the copies side by side (the parts' copies become views of
    it: no more memory). The 7B's 64-sequence step ran q+k and v as two matmuls and a split-K reduce,
    24 us a layer for 33 MB of bf16 weights. Measured (H100, 2026-12-06, `strata bench ab strata
    strata:dense_stack=1`): 64 sequences 1.005x (7B), 1.024x (1.5B); the 7B's prefill of 2,048 1.004x."""
    return _level("STRATA_DENSE_STACK", "1", ("0", "1")) == "1"


def concurrent_projections() -> bool:
    """STRATA_CONCURRENT_PROJECTIONS (default 1; 0 for off): on the GPU kernel path, the matvecs of one
    input that are separate launches (parts of different quant types, e.g. the 7B's Q4_K q+k and Q6_K
    v) run on side streams, side by side (parallel branches of a captured graph), instead of one after
    the other; each is latency-bound with less than a wave of programs. The same kernels on the same
    inputs: the same values. Measured (H100, 2026-12-06, `strata bench ab`, the same ids): decode at
    one sequence 1.013x (0.5B), 1.013x (1.5B), 1.012x (7B); the 7B at 4 and 8 sequences 1.010x, 1.003x
    (2026-12-05, on older defaults: 7B 1.030x and 1.046x, 0.982x at 8 sequences)."""
    return _level("STRATA_CONCURRENT_PROJECTIONS", "1", ("0", "1")) == "1"


def decode_steps() -> int:
    """STRATA_DECODE_STEPS (default 4, at most 64; 1 for none): decode steps run back to back on the GPU
    before the host reads their tokens, for batches whose every request takes the plain argmax
    (`SamplingParams.plain_argmax`, no think budget) and fits the captured graphs: each step's argmax is
    copied into the next step's token ids on the device, and the host reads the steps' tokens once (one
    wait instead of one a step; a request that stops early discards the rest). `strata bench ab strata
    strata:decode_steps=4` (H100, 2026-12-06, the same ids): 0.5B 1.054x, 1.5B 1.042x, 7B 1.022x, 8
    sequences 1.026x (0.5B) and 1.003x (7B); the host's time beyond the graph halves (0.11 -> 0.055 ms)."""
    return _integer("STRATA_DECODE_STEPS", 4, 1, 64)


def short_graphs() -> int:
    """STRATA_SHORT_GRAPHS (positions; default 2,048; 0 off): decode steps whose contexts all fit in that many
    positions run graphs captured for that bound (a second set, one per batch size) with an attention
    launch of their own (`short_attention`: by default at most 16 splits of 64-position tiles in two
    stages, counted as for the pool's whole length); longer contexts run the graphs for the pool's whole
    length. Eager decode steps split by the same rule. With STRATA_SHORT_SPLITS, _BLOCK_T and _STAGES at 0
    and a bound of up to STRATA_SPLIT_LEN (256), the short set's attention takes one split per KV head and
    launches no merge; under STRATA_LIVE_SPLITS the two sets then give the same bits, without it the same
    bits only within one tile of 64 positions (see `live_splits`). That form measured (H100, 2026-12-05):
    0.5B decode 0.967x alone and 1.099x over live splits, 7B 0.978x; the default launch's figures are
    `short_attention`'s."""
    return _integer("STRATA_SHORT_GRAPHS", 2048, 0)


def short_attention() -> tuple[int, int, int]:
    """(splits, block_t, stages): the paged decode attention launch of the short set of graphs
    (STRATA_SHORT_GRAPHS; without it these do nothing), from STRATA_SHORT_SPLITS (at most that many splits
    a sequence, counted as for the long set, so many sequences still take few: it replaces
    STRATA_MAX_SPLITS for the short set, and may give more splits than 0 does; default 16; 0: as many as a
    context of the short bound takes), STRATA_SHORT_BLOCK_T (a power of two from 16; default 64) and
    STRATA_SHORT_STAGES (default 2; 0 for these two: the long set's, `decode_attention_launch`). A short
    context fills few splits of a graph captured for the pool's whole length, and at 640 positions in
    graphs (H100, 2026-12-06) 16 splits of 64-position tiles in two stages took 4.17 us a layer (0.5B) and
    5.44 (7B) against the default launch's 4.80 and 6.64, while 128-position tiles win at 32k. End to end
    as a fixed 16 splits (H200): 1.005-1.050 at one to eight sequences, 0.967 on the 7B at 64 (hence the
    cap). The defaults, 16 splits at most, 64-position tiles, two stages, under a bound of 2,048 (H100,
    2026-12-07, against STRATA_SHORT_GRAPHS=0): 0.5B 1.001x, 1.5B 1.024x, 7B 1.017x at one sequence, 0.5B
    1.000x at 8, 7B 1.047x at 64."""
    block_t = _integer("STRATA_SHORT_BLOCK_T", 64, 0, 256)
    if block_t and (block_t < 16 or block_t & (block_t - 1)):
        raise ValueError(
            f"STRATA_SHORT_BLOCK_T={block_t} must be 0 or a power of two from 16 to 256; unset it for 64"
        )
    return _integer("STRATA_SHORT_SPLITS", 16, 0, 1024), block_t, _integer("STRATA_SHORT_STAGES", 2, 0, 8)


def decode_splits() -> tuple[int, int]:
    """STRATA_MAX_SPLITS (default 64, at most 1024) and STRATA_SPLIT_PROGRAMS (default 2): the GPU's
    paged decode attention cuts a context into at most MAX_SPLITS splits, as many as give
    SPLIT_PROGRAMS (sequence, KV head, split) programs per SM (fewer on short contexts). Knobs for
    measuring long contexts (`strata bench ab` arm options), where one sequence's two KV heads give
    the SMs one program each at the default cap. MAX_SPLITS 128 on the 0.5B at 32k positions (H100,
    2026-12-07): 1.054x in a first pair, then 0.994x, 0.983x and 0.988x: no gain."""
    return _integer("STRATA_MAX_SPLITS", 64, 1, 1024), _integer("STRATA_SPLIT_PROGRAMS", 2, 1, 64)


def decode_attention_launch() -> tuple[int, int, int, int]:
    """(block_t, warps, stages, split_len): the GPU's paged decode attention launch, knobs for the
    long-context sweep (`benchmarks/gpu_attention_graph.py`) to be tried end to end (`strata bench ab`
    arm options): STRATA_ATTN_BLOCK_T (positions a loop step, a power of two from 16; default 0: the
    kernel's `default_launch`, 128 or 64 by head_dim and shared memory), STRATA_ATTN_WARPS (4),
    STRATA_ATTN_STAGES (the pipelining depth; 0: `default_launch`'s, else Triton's default) and
    STRATA_SPLIT_LEN (256: no split shorter, so at most 128 splits of 32,768 positions; also the
    live splits' length under STRATA_LIVE_SPLITS=1)."""
    return (
        _integer("STRATA_ATTN_BLOCK_T", 0, 0, 256),
        _integer("STRATA_ATTN_WARPS", 4, 1, 16),
        _integer("STRATA_ATTN_STAGES", 0, 0, 8),
        _integer("STRATA_SPLIT_LEN", 256, 16, 65536),
    )


def merge_warps() -> int:
    """STRATA_MERGE_WARPS (opt-in, measured no faster; default 0: the split kernel's STRATA_ATTN_WARPS; else a
    power of two, as Triton launches): the warps of paged decode attention's merge kernel, one
    program a query head. Its reductions over the splits cross warps through shared memory: in the
    sm_90 build at 16 splits of head_dim 64, 5 barriers after the PDL wait at 4 warps, 3 at 2, none
    at 1 (231, 263 and 319 instructions). Measured (H100, 2026-12-07, decode of one sequence): 1 warp
    0.959x on the 0.5B and 0.990x on the 7B, 2 warps 1.002x and 0.991x."""
    warps = _integer("STRATA_MERGE_WARPS", 0, 0, 16)
    if warps & (warps - 1):
        raise ValueError(
            f"STRATA_MERGE_WARPS={warps} must be a power of two (1, 2, 4, 8 or 16) or 0; unset it for 0"
        )
    return warps


def pdl() -> int:
    """STRATA_PDL (default 2): the GPU kernels of a captured decode step are launched with
    programmatic dependent launch (Hopper and later): each kernel's programs start while the one
    before it finishes and wait for it in the kernel (`strata.kernels.pdl`), hiding the launch gaps
    between a step's few hundred small kernels (H200, 2026-12-04: 0.5B decode 1.155x at one sequence
    and 1.166x at 64, 7B 1.042x at one, 0.998x at 16, prefill 0.998x). At 2 the fp32-x Q8_0 and Q5_0
    matvecs (the 0.5B's) also ask L2 for their first weights before waiting (0.5B decode 1.053x and
    1.041x at one sequence, 1.007x at four, against 1). 1: PDL without that; 0: ordinary launches."""
    return int(_level("STRATA_PDL", "2", ("0", "1", "2")))


def _level(name: str, default: str, allowed: tuple[str, ...]) -> str:
    """The value of the setting `name`, one of `allowed` (unset or empty: `default`)."""
    value = os.environ.get(name, "") or default
    if value not in allowed:
        choices = f"{', '.join(allowed[:-1])} or {allowed[-1]}"
        raise ValueError(f"{name}={value!r} must be {choices}; unset it for {default}")
    return value


def _integer(name: str, default: int, least: int, most: int | None = None) -> int:
    """The value of the integer setting `name`, from `least` to `most` (unset or empty: `default`)."""
    value = os.environ.get(name, "") or str(default)
    if not value.isdigit() or int(value) < least or (most is not None and int(value) > most):
        bounds = f"from {least} to {most}" if most is not None else f"of at least {least}"
        raise ValueError(f"{name}={value!r} must be an integer {bounds}; unset it for {default}")
    return int(value)


INT8_X_TYPES = ("Q4_K", "Q6_K", "Q8_0", "Q5_0")


def int8_x_types() -> frozenset[str]:
    """STRATA_INT8_X: the quant types whose GPU matvecs quantize 16-bit activations to int8 and multiply
    with dp4a, separated by "," or "+" (default "Q4_K+Q6_K+Q5_0+Q8_0", the measured faster: Q4_K's
    planar layout; Q6_K since its kernel's rewrite (H200, 2026-12-04: 7B decode 1.055x at one
    sequence, 1.358x at four, the 0.5B 0.988x within its noise); Q5_0 since its kernel's matched,
    preloaded step (H100, 2026-12-07: 0.5B decode 1.055x, swapped 1.056x), and Q8_0 with it (the same
    day: 0.5B decode 1.025x over that, swapped 1.064x; each of the 7B's weights in a Q8_0 file faster in
    graphs, `matvec_tiles.int8_legacy_tile`); "none" for exact fp32 products everywhere). Read on
    every matvec call: the parse is cached per value."""
    return _parse_int8_x(os.environ.get("STRATA_INT8_X", "Q4_K+Q6_K+Q5_0+Q8_0").strip())


@functools.lru_cache(maxsize=8)
def _parse_int8_x(value: str) -> frozenset[str]:
    names = frozenset(n.strip().upper() for n in re.split(r"[,+]", value) if n.strip()) - {"NONE"}
    unknown = names - set(INT8_X_TYPES)
    if unknown:
        raise ValueError(
            f"STRATA_INT8_X={value!r} names {', '.join(sorted(unknown))}; use some of "
            f"{', '.join(INT8_X_TYPES)} (separated by commas or +), or none"
        )
    return names
