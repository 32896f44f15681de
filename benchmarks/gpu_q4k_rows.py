"""Q4_K decode matvecs on int8 x (M rows, default 1): the row-interleaved kernel (`_matvec_q4k_rows`,
the "rows" layout) against the planar int8 kernel's default tile, side by side, inside CUDA graphs,
on the 7B's, 1.5B's and 0.5B's Q4_K decode shapes; with --types Q6_K, Q6_K's rows kernel
(`_matvec_q6k_rows`, STRATA_Q6K_LAYOUT=rows) against Q6_K's int8 kernel at its default tile.

    python benchmarks/gpu_q4k_rows.py [--models 7b,1.5b,0.5b] [--types Q4_K,Q6_K] [--m 1] [--calls 40]
        [--rounds 3]
    python benchmarks/gpu_q4k_rows.py --smoke     # the script itself, in Triton's interpreter

Both kernels read the same x, quantized once (`quantize_x`, planar order; not timed). Each candidate
is first checked against the baseline's output and the float64 reference on a NaN-poisoned output;
a failing one is not timed. Timing is `gpu_matvec_graph.graph_call_us`: a graph of `--calls`
launches, each on its own copy of the weight (enough copies to exceed the L2), median replay per
call; the baseline and the candidates are timed in turn, `--rounds` times, and each figure is the
median of its rounds.
"""

from __future__ import annotations

import argparse
import itertools
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
from gpu_kernels import random_weight  # noqa: E402
from gpu_matvec_graph import graph_call_us, sweep_setup  # noqa: E402

from strata.kernels._matvec_q4k_rows import RowsConfig, q4_k_rows_int8_matvec, rows_config  # noqa: E402
from strata.kernels._matvec_q6k_rows import Q6KRowsConfig, q6_k_rows_int8_matvec, q6k_rows_config  # noqa: E402
from strata.kernels.int8_inputs import quantize_x  # noqa: E402
from strata.kernels.quant_matvec import default_config, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import ROWS, interleave_q6k_rows, interleave_rows, pack_quant_weight  # noqa: E402
from strata.quant import dequantize  # noqa: E402

T = GGMLQuantizationType
Q4_K, Q6_K = T.Q4_K, T.Q6_K
SHAPES = {
    "7b": [
        ("q+k+v", Q4_K, 4608, 3584), ("o", Q4_K, 3584, 3584), ("gate+up", Q4_K, 37888, 3584),
        ("down", Q4_K, 3584, 18944), ("v", Q6_K, 512, 3584), ("down", Q6_K, 3584, 18944),
        ("lm_head", Q6_K, 152064, 3584),
    ],
    "1.5b": [
        ("q+k+v", Q4_K, 2048, 1536), ("o", Q4_K, 1536, 1536), ("gate+up", Q4_K, 17920, 1536),
        ("down", Q4_K, 1536, 8960), ("down", Q6_K, 1536, 8960),
    ],
    # The 0.5B's downs (Q6_K rows by default: 448 programs of 2 warps, 7.5 % achieved occupancy in
    # Nsight Compute, H100, 2026-12-07; its Q4_K downs run the planar int8 kernel).
    "0.5b": [("down", Q6_K, 896, 4864), ("down", Q4_K, 896, 4864)],
}  # fmt: skip
SMOKE_SHAPES = [("tiny", Q4_K, 72, 768), ("tiny", Q6_K, 40, 512)]


def candidates(n: int, k: int, smoke: bool) -> list[RowsConfig]:
    """A lane per row, a warp per 32 rows: rows 32/64/128, one super-block a step (two convert every
    step under Triton 3.9), splits 1, 2, 4 (and 8-32 below 8,192 rows), each plain, with the next step's
    weights prefetched, with that and the words past L1, and with that and x's scales in 16-byte
    loads. Below 8,192 rows also a lane on half or a quarter of a super-block (`RowsConfig.subs`) at
    64 rows, split 2-32."""
    if smoke:
        return [
            RowsConfig(32, 1, 1, 1),
            RowsConfig(32, 2, 2, 2, xvec=True),
            RowsConfig(64, 1, 3, 2, True, True, True),
            RowsConfig(64, 1, 2, 2, subs=4),
        ]
    out = []
    splits = (1, 2, 4, 8, 16, 32) if n < 8192 else (1, 2, 4)
    variants = ((False, False, False), (False, True, False), (False, True, True), (True, True, False))
    for (rows, step), split, (xvec, prefetch, stream) in itertools.product(
        ((32, 1), (64, 1), (128, 1)), splits, variants
    ):
        if split > 1 and k // 256 // split < step:
            continue
        out.append(RowsConfig(rows, step, split, rows // 32 * step, xvec, prefetch, stream))
    # A lane on half or a quarter of a super-block: more lanes for the short rows (q+k+v, o).
    for subs, split in itertools.product((4, 2), splits[1:] if n < 8192 else ()):
        if k // (32 * subs) // split >= 1:
            out.append(RowsConfig(64, 1, split, 2, subs=subs))
    return out


def q6k_candidates(n: int, k: int, smoke: bool) -> list[Q6KRowsConfig]:
    """Q6_K's rows kernel: rows 32/64/128, splits 1, 2, 4 (and 8-32 below 8,192 rows, and one half
    a program where K has 33-64 halves: the 0.5B's down, 38 halves, whose 32 splits leave 6 with
    two), with and without the next half's quants prefetched."""
    if smoke:
        return [Q6KRowsConfig(32, 1), Q6KRowsConfig(32, 2, True)]
    halves = k // 128
    splits = (1, 2, 4, 8, 16, 32) if n < 8192 else (1, 2, 4)
    splits += (halves,) if n < 8192 and 32 < halves <= 64 else ()
    return [Q6KRowsConfig(r, s, p) for r, s, p in itertools.product((32, 64, 128), splits, (False, True))]


def kernel_planes(qtype: T, planes: tuple[torch.Tensor, ...], rows: int) -> tuple[torch.Tensor, ...]:
    """The packed planes regrouped by `rows` rows for the rows kernel of `qtype`."""
    return interleave_rows(planes, rows) if qtype == Q4_K else interleave_q6k_rows(planes, rows)


def rows_launch(qtype: T, xq, planes, n: int, k: int, out: torch.Tensor, cfg, smoke: bool, ws) -> None:
    if qtype == Q4_K:
        q4_k_rows_int8_matvec(*xq, planes, n, k, out, cfg, use_asm=not smoke, workspace=ws)
    else:
        q6_k_rows_int8_matvec(xq[0], xq[1], planes, n, k, out, cfg, use_asm=not smoke, workspace=ws)


def sweep(model: str, name: str, qtype: T, n: int, k: int, args: argparse.Namespace, gen: torch.Generator):
    """Check every candidate on one shape, then time the baseline and the correct ones in turn;
    returns (the table row or None under --smoke, the number of failed checks)."""
    device = gen.device
    raw = random_weight(qtype, n, k, str(device), gen)
    copies = 1 if args.smoke else max(1, min(args.calls, math.ceil(240e6 / raw.numel())))
    planar = qtype == Q4_K  # x's order: Q4_K's planar nibbles, else element order
    layout = "planar" if planar else None
    packed = [
        pack_quant_weight(raw.clone() if i else raw, qtype, n, k, layout, q6k_layout="blocks")
        for i in range(copies)
    ]
    x = torch.randn(args.m, k, device=device, generator=gen).to(torch.bfloat16)
    ref = x.double() @ dequantize(raw, qtype, (n, k)).double().T
    xq = quantize_x(x, planar=planar)
    out = torch.empty(args.m, n, dtype=torch.bfloat16, device=device)
    base_cfg = replace(default_config(qtype, args.m, n, k, planar_int8=planar), int8_x=True)

    def baseline(i: int) -> None:
        quant_matvec(x, packed[i % len(packed)], qtype, n, k, out=out, config=base_cfg, x_int8={planar: xq})

    baseline(0)
    base_out = out.double().clone()
    limit = 3e-2 * ref.abs().max().item()
    assert (base_out - ref).abs().max().item() <= limit, "baseline differs from the reference"
    arms: dict[str, Callable[[int], None]] = {"baseline": baseline}
    by_rows: dict[int, list[tuple[torch.Tensor, ...]]] = {}
    failures = 0
    sms = 132 if args.smoke else torch.cuda.get_device_properties(device).multi_processor_count
    default: RowsConfig | Q6KRowsConfig
    if planar:
        default = rows_config(n, k, ROWS, sms)  # what STRATA_Q4K_LAYOUT=rows launches
        configs: list[RowsConfig | Q6KRowsConfig] = [*candidates(n, k, args.smoke), default]
    else:
        default = q6k_rows_config(n, k, ROWS, sms)  # what STRATA_Q6K_LAYOUT=rows launches
        configs = [*q6k_candidates(n, k, args.smoke), default]
    for cfg in configs:
        rows, split = cfg.rows, cfg.split_k
        label = f"rows {rows} split {split}" + " prefetch" * cfg.prefetch
        if isinstance(cfg, RowsConfig):
            label += f" step {cfg.step} warps {cfg.num_warps}" + " xvec" * cfg.xvec + " stream" * cfg.stream
            label += f" subs {cfg.subs}" * (cfg.subs != 8)
        label += " (rows_config)" * (cfg == default)
        planes = by_rows.setdefault(rows, [kernel_planes(qtype, w.planes, rows) for w in packed])
        ws = (
            torch.zeros(split, args.m, n, device=device),
            torch.zeros(-(-n // rows), dtype=torch.int32, device=device),
        )

        def arm(i: int, planes=planes, ws=ws, cfg=cfg) -> None:
            rows_launch(qtype, xq, planes[i % len(planes)], n, k, out, cfg, args.smoke,
                        ws if cfg.split_k > 1 else None)  # fmt: skip

        out.fill_(float("nan"))
        try:
            arm(0)
        except Exception as e:  # a config the compiler rejects
            print(f"{model} {name} {label}: {type(e).__name__}: {str(e)[:160]}")
            continue
        got = out.double()
        vs_base = (got - base_out).abs().max().item()
        vs_ref = (got - ref).abs().max().item()
        if not (torch.isfinite(got).all() and vs_ref <= limit and vs_base <= limit / 3):
            failures += 1
            print(f"{model} {name} {label}: WRONG RESULT (vs base {vs_base:.3g}, vs reference {vs_ref:.3g})")
            continue
        arms[label] = arm
    if args.smoke:
        print(f"{model} {name}: {len(arms) - 1} candidates checked")
        return None, failures
    times: dict[str, list[float]] = {a: [] for a in arms}
    for _ in range(args.rounds):
        for label, run in arms.items():
            times[label].append(graph_call_us(run, args.calls))
    med = {a: statistics.median(t) for a, t in times.items()}
    best = min((a for a in med if a != "baseline"), key=med.__getitem__)
    for a, t in sorted(med.items(), key=lambda kv: kv[1]):
        print(
            f"{model} {name} {qtype.name} {n}x{k}: {a}: {t:.2f} us ({min(times[a]):.2f}-{max(times[a]):.2f})",
            flush=True,
        )
    return (
        model,
        f"{name} {qtype.name}",
        n,
        k,
        packed[0].nbytes / 1e6,
        med["baseline"],
        best,
        med[best],
    ), failures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="7b,1.5b")
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--m", type=int, default=1, help="x rows (decode sequences), 1 to 16")
    p.add_argument("--types", default="Q4_K", help="Q4_K, Q6_K or both: Q4_K,Q6_K")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    _, gen, ceiling, shapes = sweep_setup(args, SHAPES, SMOKE_SHAPES)
    table, failures = [], 0
    types = args.types.split(",")
    for model, name, qtype, n, k in shapes:
        if qtype.name not in types and not args.smoke:
            continue
        row, failed = sweep(model, name, qtype, n, k, args, gen)
        failures += failed
        if row is not None:
            table.append(row)
    if args.smoke:
        print(f"checks failed: {failures}")
        return 1 if failures else 0
    print(f"\ncopy ceiling {ceiling:,.0f} GB/s; M = {args.m}; per call inside a graph of {args.calls} calls; "
          f"medians of {args.rounds} rounds")  # fmt: skip
    print("| model | weight | MB | planar int8 default us | best row-interleaved | us | ratio | of copy |")
    print("|---|---|---:|---:|---|---:|---:|---:|")
    for model, name, n, k, mb, base, best, us in table:
        base_of_copy = mb * 1e3 / base / ceiling
        print(f"| {model} | {name} {n}x{k} | {mb:.1f} | {base:.2f} ({base_of_copy:.0%}) | {best} | "
              f"{us:.2f} | {base / us:.3f} | {mb * 1e3 / us / ceiling:.0%} |")  # fmt: skip
    print(f"checks failed: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
