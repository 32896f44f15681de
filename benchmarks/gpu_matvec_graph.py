"""The fused matvec as decode runs it: inside a CUDA graph, on the exact decode shapes, per tile config.

    python benchmarks/gpu_matvec_graph.py [--models 0.5b,7b] [--types Q4_K,Q6_K] [--layouts blocks,planar]
        [--tensor-core] [--m 1] [--splits 2,3,4] [--calls 40] [--int8-ready] [--out DIR]
    python benchmarks/gpu_matvec_graph.py --smoke     # the script itself, in Triton's interpreter

`benchmarks/gpu_kernels.py` times one launch at a time with do_bench, which for the 0.5B's small
matrices (0.1-6 MB, a few µs each) mostly measures the launch. Decode replays graphs, so here each
config is captured as a graph of `--calls` launches, each on its own copy of the weight (enough
copies to exceed the 60 MB L2, so the weights come from HBM as in a real step), and the median replay
time over the calls is the per-call figure. Each config is first checked against the torch reference
(dequantize, float64 matmul) on fresh random inputs with a NaN-poisoned output; a failing config is
not timed. Shapes are those a decode step runs after strata's projection stacking (q+k+v or q+k,
gate+up). The table lists, per shape, the default config's time, the best config and its time and
effective bandwidth (weight bytes / time) as a fraction of the copy ceiling measured in the run.
Q4_K shapes are swept once per `--layouts` entry (quant_pack's "blocks" and "planar" layouts, each
with its own kernel); `--tensor-core` adds the tensor-core matmul as a candidate (rejected for M = 1
on 2026-12-03: 2-3x slower than the matvec).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch
from gguf.constants import GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).parent))
from gpu_kernels import copy_ceiling_gbs, random_weight  # noqa: E402

from strata.kernels._int8_x import Int8X  # noqa: E402
from strata.kernels.int8_inputs import int8_order, quantize_x  # noqa: E402
from strata.kernels.matvec_checks import program_steps  # noqa: E402
from strata.kernels.matvec_tiles import env_tile  # noqa: E402
from strata.kernels.quant_matmul import MatmulConfig, quant_matmul  # noqa: E402
from strata.kernels.quant_matvec import MatvecConfig, auto_split_k, default_config, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import PackedQuantWeight, pack_quant_weight  # noqa: E402
from strata.quant import dequantize  # noqa: E402

T = GGMLQuantizationType
# (name, qtype, n, k) per model, as the kernel path stacks them (Q4_K_M layouts, benchmarks/notes).
SHAPES = {
    "0.5b": [
        ("q+k+v", T.Q5_0, 1152, 896), ("q+k", T.Q5_0, 1024, 896), ("v", T.Q8_0, 128, 896),
        ("o", T.Q5_0, 896, 896), ("gate+up", T.Q5_0, 9728, 896), ("down", T.Q4_K, 896, 4864),
        ("down", T.Q6_K, 896, 4864), ("lm_head", T.Q8_0, 151936, 896),
    ],
    "1.5b": [
        ("q+k+v", T.Q4_K, 2048, 1536), ("o", T.Q4_K, 1536, 1536), ("gate+up", T.Q4_K, 17920, 1536),
        ("down", T.Q4_K, 1536, 8960), ("down", T.Q6_K, 1536, 8960),
    ],
    "7b": [
        ("q+k", T.Q4_K, 4096, 3584), ("v", T.Q6_K, 512, 3584), ("q+k+v", T.Q4_K, 4608, 3584),
        ("o", T.Q4_K, 3584, 3584), ("gate+up", T.Q4_K, 37888, 3584), ("down", T.Q4_K, 3584, 18944),
        ("down", T.Q6_K, 3584, 18944), ("lm_head", T.Q6_K, 152064, 3584),
    ],
    # the 7B's shapes in a Q8_0 file (every weight Q8_0): the int8 kernel's rows longer than 2,048
    "7b-q8_0": [
        ("q+k+v", T.Q8_0, 4608, 3584), ("o", T.Q8_0, 3584, 3584), ("gate+up", T.Q8_0, 37888, 3584),
        ("down", T.Q8_0, 3584, 18944),
    ],
}  # fmt: skip
SMOKE_SHAPES = [("tiny", T.Q5_0, 40, 256), ("tiny", T.Q4_K, 40, 512)]


Config = MatvecConfig | MatmulConfig


def fp32_explicit(candidates: list[Config], qtype: GGMLQuantizationType) -> list[Config]:
    """`candidates` with each Q8_0 and Q5_0 config that leaves int8_x to STRATA_INT8_X made explicit:
    those are the 16-bit-x kernels' configs (both types go int8 by default; the default tile is timed
    apart)."""
    if qtype not in (T.Q8_0, T.Q5_0):
        return candidates
    return [
        replace(c, int8_x=False) if isinstance(c, MatvecConfig) and c.int8_x is None else c
        for c in candidates
    ]


def configs(
    qtype: GGMLQuantizationType,
    n: int,
    k: int,
    layout: str,
    tensor_core: bool,
    smoke: bool,
    int8_only: bool,
    m: int = 1,
) -> list[Config]:
    """Matvec: rows per program x K step x warps, each unsplit and with the launcher's automatic split,
    compiled once per type (N and K are run-time arguments); the planar Q4_K kernel also tries
    1,024- and 2,048-element steps, each config with fp32 x, with prefetch, with int8 x and with int8
    x and all rows of a step at once (M > 1) or a flat accumulator (M = 1, also Q5_0); Q6_K, Q8_0 and
    Q5_0 also with int8 x (--int8-only: the int8 configs alone); fp32-x Q8_0 and Q5_0 also with
    matched loads and, where a program takes one K step, with its weights loaded before the PDL wait
    (plain and matched; the int8 Q4_K and Q6_K kernels: their first step's; the int8 Q8_0 and Q5_0
    kernels: matched, and matched and preloaded, each with half a block a lane and a whole one; at 2-4
    rows of x, the whole block); Q5_0's matched preload on tall weights (512 tiles and more) also
    with 2-4 row tiles a program.
    Matmul (with --tensor-core): the tensor-core kernel with its row tile padded to 16, in both operand
    orders, as a candidate for 16-bit x."""
    if smoke:
        int8 = MatvecConfig(8, 256, 2, int8_x=True)
        extra = [int8, replace(int8, rows_at_once=True)] if layout == "planar" else []
        if layout == "planar" and m == 1:
            flat = replace(int8, flat_acc=True)
            scalar = replace(flat, scalar_scales=True)
            extra += [flat, scalar, replace(scalar, paired_dm=True)]
            extra.append(replace(scalar, preload=True))
        extra += [int8] if qtype in (T.Q6_K, T.Q8_0, T.Q5_0) else []
        extra += [replace(int8, preload=True)] if qtype == T.Q6_K else []
        if qtype in (T.Q8_0, T.Q5_0) and m == 1:
            preload = MatvecConfig(8, 256, 1, preload=True)
            extra.append(MatvecConfig(8, 256, 2, int8_x=True, matched_loads=True, lane_blocks=True))
            extra += [
                MatvecConfig(8, 256, 2, matched_loads=True),
                preload,
                replace(preload, matched_loads=True),
            ]
        if int8_only:
            return extra
        return [
            MatvecConfig(16, 256, 1),
            MatvecConfig(8, 256, 2),
            MatmulConfig(16, 32, 64, swap_ab=True),
            *extra,
        ]
    planar = layout == "planar"
    unit = 32 if planar else 128 if qtype == T.Q6_K else 64 if qtype == T.Q4_K else 32
    # 4,096 (planar, 8 rows): the 7B's K = 3,584 in one step, so `preload` holds all of a program's weights.
    steps = (256, 512, 1024, 2048, 4096) if planar else (256, 512, 1024)
    out: list[Config] = []
    for bn, bk, warps in itertools.product((8, 16, 32, 64), steps, (4, 8)):
        if bk % unit or bn * bk > (32768 if planar else 16384):
            continue
        # The planar kernel: fp32 x, fp32 x with prefetch, x quantized to int8 (dp4a), the latter also
        # with all rows of a step at once (for --m > 1).
        variants = [(False, False, False), (True, False, False), (False, True, False), (False, True, True)]
        if not planar:  # the block kernels; Q6_K, Q8_0 and Q5_0 also on int8 x
            variants = [(False, None, False)]
            variants += [(False, True, False)] if qtype in (T.Q6_K, T.Q8_0, T.Q5_0) else []
        if int8_only:
            variants = [v for v in variants if v[1]]
        if m == 1:  # all rows at once is the same work for one row
            variants = [v for v in variants if not v[2]]
        for split, (prefetch, int8, at_once) in itertools.product(
            sorted({1, auto_split_k(n, k, bn, bk)}), variants
        ):
            out.append(MatvecConfig(bn, bk, split, warps, prefetch, int8, at_once))
            if m == 1 and ((planar and int8) or (qtype == T.Q5_0 and int8 is None)):  # and a flat accumulator
                out.append(MatvecConfig(bn, bk, split, warps, prefetch, int8, at_once, flat_acc=True))
            if qtype == T.Q6_K and int8:  # and the scales loaded in the products' layout; each prefetching
                q6 = MatvecConfig(bn, bk, split, warps, prefetch, int8, at_once)
                out.append(replace(q6, scalar_scales=True))
                out += [replace(q6, prefetch=True), replace(q6, scalar_scales=True, prefetch=True)]
                out += [replace(q6, preload=True), replace(q6, scalar_scales=True, preload=True)]
            if m == 1 and planar and int8:  # and the scales (and x) loaded in the words' layout
                flat = MatvecConfig(bn, bk, split, warps, prefetch, int8, at_once, flat_acc=True)
                out.append(replace(flat, scalar_scales=True))
                if bk >= 1024:  # the long steps (the default's): next weights in flight, registers capped,
                    # d and dmin in one load
                    scalar = replace(flat, scalar_scales=True)
                    out += [replace(scalar, prefetch=True), replace(scalar, max_registers=96)]
                    out.append(replace(scalar, prefetch=True, max_registers=96))
                    out += [replace(scalar, paired_dm=True), replace(scalar, paired_dm=True, prefetch=True)]
                    out.append(replace(scalar, preload=True))  # the first step's weights before the wait
            if m == 1 and qtype in (T.Q8_0, T.Q5_0) and int8:  # the dp4a kernel's matched loads (preloaded)
                for lanes in (False, True):  # a half block a lane, and a whole one
                    matched = MatvecConfig(bn, bk, split, warps, int8_x=True, matched_loads=True)
                    matched = replace(matched, lane_blocks=lanes)
                    out.append(matched)
                    if -(-k // 32 // split) <= bk // 32:
                        out.append(replace(matched, preload=True))
            if 1 < m <= 4 and qtype in (T.Q8_0, T.Q5_0) and int8:  # batched: a whole block a lane
                out.append(MatvecConfig(bn, bk, split, warps, int8_x=True, lane_blocks=True))
            if m == 1 and qtype in (T.Q8_0, T.Q5_0) and int8 is None:  # and every load in one layout
                out.append(MatvecConfig(bn, bk, split, warps, matched_loads=True))
                if -(-k // 32 // split) <= bk // 32:  # one step a program: its weights before the wait
                    out.append(MatvecConfig(bn, bk, split, warps, preload=True))
                    out.append(MatvecConfig(bn, bk, split, warps, matched_loads=True, preload=True))
    if tensor_core:
        for swap, bn, bk in itertools.product((False, True), (16, 32, 64), (128, 256)):
            out.append(MatmulConfig(16, bn, bk, num_warps=4, num_stages=3, swap_ab=swap))
    return out


def launch(
    x: torch.Tensor,
    w: PackedQuantWeight,
    out: torch.Tensor,
    cfg: Config,
    x_int8: dict[bool, Int8X] | None = None,
) -> None:
    if isinstance(cfg, MatmulConfig):
        quant_matmul(x, w, out=out, config=cfg)
    else:
        quant_matvec(x, w, w.qtype, w.n, w.k, out=out, config=cfg, x_int8=x_int8)


def check(x: torch.Tensor, w: PackedQuantWeight, ref: torch.Tensor, cfg: Config) -> bool:
    """Within 1 % of the largest |ref| (bf16 output rounding; 3 % when x is quantized to int8, whose
    rounding adds up to max|x| / 254 per element), every element written. A wrong kernel is off by
    about |ref| itself."""
    out = torch.full((x.shape[0], w.n), float("nan"), dtype=x.dtype, device=x.device)
    launch(x, w, out, cfg)
    got = out.double()
    int8 = isinstance(cfg, MatvecConfig) and (
        bool(cfg.int8_x) or (cfg.int8_x is None and x.dtype != torch.float32 and int8_order(w) is not None)
    )
    limit = (3e-2 if int8 else 1e-2) * ref.abs().max().item()
    return bool(torch.isfinite(got).all()) and (got - ref).abs().max().item() <= limit


def with_splits(candidates: list[Config], splits: list[int], qtype: T, k: int) -> list[Config]:
    """Each matvec candidate again at each K split of `splits` it does not already have. The sweep's
    own splits are 1 and `auto_split_k`'s, which gives 1 whenever the row tiles alone make two per SM,
    so a tall weight's long rows (the 7B's down: 448 tiles of 8 rows, 9 steps of 2,048 each) are
    never tried with fewer steps a program and more programs in flight. An int8 config that a split
    makes one step a program is also tried preloaded (its weights loaded before the PDL wait, as
    `env_tile` gives one-step tiles): the 0.5B's Q4_K down at 8 x 512 split 10, for one."""
    have = set(candidates)
    out = []
    for c in candidates:
        for s in splits:
            if isinstance(c, MatvecConfig) and c.preload and s < c.split_k:
                continue  # fewer splits: more than the one step a preloaded program takes
            new = replace(c, split_k=s) if isinstance(c, MatvecConfig) else c
            for twin in (new, *_preloaded(new, qtype, k)):
                if twin not in have:
                    have.add(twin)
                    out.append(twin)
    return out


def _preloaded(c: Config, qtype: T, k: int) -> list[Config]:
    """`c` preloaded where it is an int8 config of one step a program not preloaded yet, in a kernel
    whose preload takes it: Q4_K's planar and Q6_K's (any split), Q8_0's and Q5_0's (the matched or
    the lanes' step)."""
    if not isinstance(c, MatvecConfig) or not c.int8_x or c.preload or program_steps(c, k) > 1:
        return []
    takes = qtype in (T.Q4_K, T.Q6_K) or c.matched_loads or c.lane_blocks
    return [replace(c, preload=True)] if takes else []


def graph_us(
    x: torch.Tensor, weights: list[PackedQuantWeight], cfg: Config, calls: int, int8_ready: bool = False
) -> float:
    """Per-call time of `cfg` in a graph; `int8_ready`: an int8-x config reads x quantized once before
    the graph (in both orders), as decode reads a norm's or the attention merge's copy, so that its
    time is the matvec's alone rather than the matvec's and a `quantize_x` launch's."""
    out = torch.empty(x.shape[0], weights[0].n, dtype=x.dtype, device=x.device)
    ready = {planar: quantize_x(x, planar=planar) for planar in (False, True)} if int8_ready else None
    return graph_call_us(lambda i: launch(x, weights[i % len(weights)], out, cfg, ready), calls)


def graph_call_us(run: Callable[[int], None], calls: int) -> float:
    """Median per-call time of a CUDA graph of `calls` launches (run(i) launches call i), over 7
    replays, after one eager pass (which compiles)."""
    for i in range(calls):
        run(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            run(i)
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def load_layouts(timed: list[tuple[Config, float]], default: Config) -> str:
    """The matvecs' load layouts compared (int8 Q4_K and Q6_K: scales vectorized or in the words'
    layout, x converted or loaded per row, Q4_K's long steps also with the next step's weights
    prefetched, registers capped or d and dmin paired; fp32 Q8_0 and Q5_0: matched loads or not): the
    best time of each and the default tile's in each (us), int8 and fp32-x configs apart."""
    groups: dict[str, list[float]] = {}
    at_default: dict[str, float] = {}
    for cfg, us in timed:
        if not isinstance(cfg, MatvecConfig):
            continue
        if cfg.rows_at_once or (cfg.prefetch and not cfg.int8_x):
            continue
        key = ("int8 " if cfg.int8_x else "fp32 ") + ("scalar" if cfg.scalar_scales else "vector")
        key += " flat" if cfg.flat_acc else ""
        key += " matched" if cfg.matched_loads else ""
        key += " preload" if cfg.preload else ""
        key += " lane_blocks" if cfg.lane_blocks else ""
        key += " prefetch" if cfg.prefetch else ""
        key += f" maxnreg {cfg.max_registers}" if cfg.max_registers else ""
        key += " paired_dm" if cfg.paired_dm else ""
        groups.setdefault(key, []).append(us)
        if isinstance(default, MatvecConfig) and (cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_warps) == (
            default.block_n,
            default.block_k,
            default.split_k,
            default.num_warps,
        ):
            at_default[key] = us
    return "; ".join(
        f"{key} best {min(v):.2f}, default tile {at_default.get(key, math.nan):.2f}"
        for key, v in sorted(groups.items())
    )


def sweep_setup(args: argparse.Namespace, by_model: dict, smoke_shapes: list) -> tuple:
    """(device, a seeded generator on it, the copy ceiling in GB/s (NaN under --smoke), the shapes
    of --models from `by_model`, each prefixed by its model, or `smoke_shapes` under --smoke)."""
    device = "cpu" if args.smoke else "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    ceiling = math.nan if args.smoke else copy_ceiling_gbs(device, False)
    shapes = [("smoke", *s) for s in smoke_shapes] if args.smoke else [
        (model, *s) for model in args.models.split(",") for s in by_model[model]
    ]  # fmt: skip
    return device, gen, ceiling, shapes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="0.5b,7b")
    p.add_argument("--types", default="", help="only these quant types, e.g. Q4_K,Q6_K (default all)")
    p.add_argument("--layouts", default="blocks,planar", help="Q4_K packings to sweep")
    p.add_argument("--tensor-core", action="store_true", help="also time the tensor-core matmul")
    p.add_argument("--int8-only", action="store_true", help="only the int8-x configs (and the default)")
    p.add_argument(
        "--int8-ready",
        action="store_true",
        help="int8-x configs read x quantized before the graph (see graph_us)",
    )
    p.add_argument("--m", type=int, default=1, help="activation rows (1 = batch-1 decode)")
    p.add_argument("--tiles", default="", help="only matvec tiles BLOCK_NxBLOCK_K, e.g. 8x2048,8x1024")
    p.add_argument("--splits", default="", help="also each matvec tile at these K splits, e.g. 2,3,4")
    p.add_argument("--calls", type=int, default=40)
    p.add_argument(
        "--resident",
        action="store_true",
        help="every call on one copy of the weight, held in L2 (a weight read from L2, not HBM)",
    )
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = p.parse_args()
    device, gen, ceiling, shapes = sweep_setup(args, SHAPES, SMOKE_SHAPES)
    types = set(filter(None, args.types.split(",")))
    shapes = [s for s in shapes if not types or s[2].name in types]
    layouts = args.layouts.split(",")
    shapes = [(*s, lay) for s in shapes for lay in (layouts if s[2] == T.Q4_K else ["blocks"])]
    rows, failures = [], 0
    for model, name, qtype, n, k, layout in shapes:
        raw = random_weight(qtype, n, k, device, gen)
        nbytes = raw.numel()
        copies = 1 if args.smoke or args.resident else max(1, min(args.calls, math.ceil(240e6 / nbytes)))
        # Q6_K in blocks: the tiles a MatvecConfig launches (its rows kernel: gpu_q4k_rows.py --types Q6_K).
        weights = [
            pack_quant_weight(raw.clone() if i else raw, qtype, n, k, layout, q6k_layout="blocks")
            for i in range(copies)
        ]
        nbytes = weights[0].nbytes  # the bytes the kernel reads (the planar layout has 4 more per 256)
        name = f"{name} ({layout})" if qtype == T.Q4_K else name
        x = torch.randn(args.m, k, device=device, generator=gen).to(torch.bfloat16)
        ref = x.double() @ dequantize(raw, qtype, (n, k)).double().T
        # bf16 x: the planar layout's matvec runs on int8 x by default (STRATA_INT8_X), with its own tiles.
        # The tile quant_matvec runs without a config (STRATA_MATVEC_PRELOAD's included).
        planar_int8 = layout == "planar"
        default = env_tile(default_config(qtype, args.m, n, k, planar_int8=planar_int8), weights[0], args.m,
                           planar_int8)  # fmt: skip
        candidates = configs(qtype, n, k, layout, args.tensor_core, args.smoke, args.int8_only, args.m)
        candidates = fp32_explicit(candidates, qtype)
        if args.tiles:
            tiles = set(args.tiles.split(","))
            candidates = [c for c in candidates if f"{c.block_n}x{c.block_k}" in tiles]
        splits = [int(s) for s in filter(None, args.splits.split(","))]
        candidates += with_splits(candidates, splits, qtype, k)
        results = []
        for cfg in [default, *[c for c in candidates if c != default]]:
            try:
                ok = check(x, weights[0], ref, cfg)
            except Exception as e:  # a config the compiler rejects (registers, shared memory)
                print(f"{model} {name} {qtype.name} {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            if not ok:
                failures += 1
                print(f"{model} {name} {qtype.name} {cfg}: WRONG RESULT", flush=True)
                continue
            if args.smoke:
                results.append((cfg, math.nan))
                continue
            results.append((cfg, graph_us(x, weights, cfg, args.calls, args.int8_ready)))
        timed = [r for r in results if math.isfinite(r[1])] or results
        best = min(timed, key=lambda r: r[1] if math.isfinite(r[1]) else 0.0)
        default_us = next((us for cfg, us in results if cfg == default), math.nan)
        gbs = nbytes / best[1] / 1e3 if math.isfinite(best[1]) else math.nan
        rows.append({"model": model, "name": name, "qtype": qtype.name, "n": n, "k": k, "mb": nbytes / 1e6,
                     "default": str(default), "default_us": default_us, "best": str(best[0]),
                     "best_us": best[1], "gbs": gbs, "of_copy": gbs / ceiling,
                     "all": [(str(cfg), us) for cfg, us in results]})  # fmt: skip
        mm = [r for r in timed if isinstance(r[0], MatmulConfig)]
        if mm and not args.smoke:
            b = min(mm, key=lambda r: r[1])
            print(f"{model} {name} {qtype.name}: best tensor-core {b[1]:.2f} us {b[0]}", flush=True)
        print(f"{model} {name} {qtype.name}: default {default_us:.2f} us, best {best[1]:.2f} us {best[0]}",
              flush=True)  # fmt: skip
        if (layout == "planar" or qtype in (T.Q6_K, T.Q8_0, T.Q5_0)) and not args.smoke:
            print(f"{model} {name}: {load_layouts(timed, default)}", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_matvec_graph.json").write_text(json.dumps({"ceiling_gbs": ceiling, "rows": rows}))
    print(f"\ncopy ceiling {ceiling:,.0f} GB/s; M={args.m}; per call inside a graph of {args.calls} calls")
    print("| model | weight | type | MB | default us | best config | best us | GB/s | of copy |")
    print("|---|---|---|---:|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['name']} {r['n']}x{r['k']} | {r['qtype']} | {r['mb']:.1f} | "
              f"{r['default_us']:.2f} | {r['best']} | {r['best_us']:.2f} | {r['gbs']:,.0f} | "
              f"{r['of_copy']:.0%} |")  # fmt: skip
    print(f"checks failed: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
