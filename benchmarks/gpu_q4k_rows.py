"""Q4_K decode matvecs on int8 x (M rows, default 1): the row-interleaved kernel (`_matvec_q4k_rows`,
the "rows" layout) against the planar int8 kernel's default tile, side by side, inside CUDA graphs,
on the 7B's and 1.5B's Q4_K decode shapes.

    python benchmarks/gpu_q4k_rows.py [--models 7b,1.5b] [--m 1] [--calls 40] [--rounds 3]
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
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch
from gguf.constants import GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).parent))
from gpu_kernels import random_weight  # noqa: E402
from gpu_matvec_graph import graph_call_us, sweep_setup  # noqa: E402

from strata.kernels._matvec_q4k_rows import RowsConfig, q4_k_rows_int8_matvec, rows_config  # noqa: E402
from strata.kernels.int8_inputs import quantize_x  # noqa: E402
from strata.kernels.quant_matvec import default_config, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import ROWS, interleave_rows, pack_quant_weight  # noqa: E402
from strata.quant import dequantize  # noqa: E402

Q4_K = GGMLQuantizationType.Q4_K
SHAPES = {
    "7b": [("q+k+v", 4608, 3584), ("o", 3584, 3584), ("gate+up", 37888, 3584), ("down", 3584, 18944)],
    "1.5b": [("q+k+v", 2048, 1536), ("o", 1536, 1536), ("gate+up", 17920, 1536), ("down", 1536, 8960)],
}
SMOKE_SHAPES = [("tiny", 72, 768)]


def candidates(n: int, k: int, smoke: bool) -> list[RowsConfig]:
    """A lane per row, a warp per 32 rows: rows 32/64/128, one super-block a step (two convert every
    step under Triton 3.9), splits 1, 2, 4 (and 8-32 below 8,192 rows), each plain, with the next step's
    weights prefetched, with that and the words past L1, and with that and x's scales in 16-byte
    loads."""
    if smoke:
        return [
            RowsConfig(32, 1, 1, 1),
            RowsConfig(32, 2, 2, 2, xvec=True),
            RowsConfig(64, 1, 3, 2, True, True, True),
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
    return out


def kernel_planes(planar: tuple[torch.Tensor, ...], rows: int) -> tuple[torch.Tensor, ...]:
    """The planar planes regrouped by `rows` rows as the kernel takes them (qs and dm as int32)."""
    qs, scm, dm = interleave_rows(planar, rows)
    return qs.view(torch.int32), scm, dm.view(torch.int32)


def sweep(model: str, name: str, n: int, k: int, args: argparse.Namespace, gen: torch.Generator):
    """Check every candidate on one shape, then time the baseline and the correct ones in turn;
    returns (the table row or None under --smoke, the number of failed checks)."""
    device = gen.device
    raw = random_weight(Q4_K, n, k, str(device), gen)
    copies = 1 if args.smoke else max(1, min(args.calls, math.ceil(240e6 / raw.numel())))
    packed = [pack_quant_weight(raw.clone() if i else raw, Q4_K, n, k, "planar") for i in range(copies)]
    x = torch.randn(args.m, k, device=device, generator=gen).to(torch.bfloat16)
    ref = x.double() @ dequantize(raw, Q4_K, (n, k)).double().T
    xq = quantize_x(x, planar=True)
    out = torch.empty(args.m, n, dtype=torch.bfloat16, device=device)
    base_cfg = default_config(Q4_K, args.m, n, k, planar_int8=True)

    def baseline(i: int) -> None:
        quant_matvec(x, packed[i % len(packed)], Q4_K, n, k, out=out, config=base_cfg, x_int8={True: xq})

    baseline(0)
    base_out = out.double().clone()
    limit = 3e-2 * ref.abs().max().item()
    assert (base_out - ref).abs().max().item() <= limit, "baseline differs from the reference"
    arms: dict[str, Callable[[int], None]] = {"baseline": baseline}
    by_rows: dict[int, list[tuple[torch.Tensor, ...]]] = {}
    failures = 0
    sms = 132 if args.smoke else torch.cuda.get_device_properties(device).multi_processor_count
    default = rows_config(n, k, ROWS, sms)  # what STRATA_Q4K_LAYOUT=rows launches
    for cfg in [*candidates(n, k, args.smoke), default]:
        rows, split = cfg.rows, cfg.split_k
        label = f"rows {rows} step {cfg.step} split {split} warps {cfg.num_warps}"
        label += " xvec" * cfg.xvec + " prefetch" * cfg.prefetch + " stream" * cfg.stream
        label += " (rows_config)" * (cfg == default)
        planes = by_rows.setdefault(rows, [kernel_planes(w.planes, rows) for w in packed])
        ws = (
            torch.zeros(split, args.m, n, device=device),
            torch.zeros(-(-n // rows), dtype=torch.int32, device=device),
        )

        def arm(i: int, planes=planes, ws=ws, cfg=cfg) -> None:
            q4_k_rows_int8_matvec(*xq, planes[i % len(planes)], n, k, out, cfg, use_asm=not args.smoke,
                                  workspace=ws if cfg.split_k > 1 else None)  # fmt: skip

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
            f"{model} {name} {n}x{k}: {a}: {t:.2f} us ({min(times[a]):.2f}-{max(times[a]):.2f})", flush=True
        )
    return (model, name, n, k, packed[0].nbytes / 1e6, med["baseline"], best, med[best]), failures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="7b,1.5b")
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--m", type=int, default=1, help="x rows (decode sequences), 1 to 16")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    _, gen, ceiling, shapes = sweep_setup(args, SHAPES, SMOKE_SHAPES)
    table, failures = [], 0
    for model, name, n, k in shapes:
        row, failed = sweep(model, name, n, k, args, gen)
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
