"""Correctness, then speed, of the fused dequant + matmul kernel (`quant_matmul`) on the GPU.

    python benchmarks/gpu_matmul.py [--small]

The GPU machine has no `gguf`; bring its pure-Python package on PYTHONPATH (see gpu_kernels.py).
`--small` runs tiny shapes in Triton's interpreter on the CPU to check this script itself: only the
correctness part means anything there.

For each weight (type, N x K) and batch M (bf16 x): the kernel's output, for each tile config, is
first checked against the weight dequantized to bf16 then torch.matmul in fp32 (max |error| / max
|ref|, fresh random inputs, output poisoned with NaN); a failing config is not timed. Then
`triton.testing.do_bench` (median) times it against two baselines: torch.matmul on the weight
dequantized once to bf16 (the speed of light for an unfused path), and "dequantize then matmul" per
call (strata.kernels.dequant_packed to bf16, then cuBLAS), the path QuantLinear takes from
STRATA_DENSE_ROWS rows (64) on. For M <= 16 the fused matvec is timed too. Prints a markdown table
(TFLOP/s = 2 M N K / time). Exit status 1 if any check failed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

if "--small" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import torch.nn.functional as F
import triton
from gguf.constants import GGMLQuantizationType

from strata.kernels.dequant_packed import dequantize_packed
from strata.kernels.quant_matmul import MatmulConfig, default_config, quant_matmul
from strata.kernels.quant_matvec import quant_matvec
from strata.kernels.quant_pack import PackedQuantWeight, pack_quant_weight
from strata.quant import dequantize

sys.path.insert(0, str(Path(__file__).parent))
from gpu_kernels import random_weight  # noqa: E402  (the same random GGUF bytes as the kernel sweep)

T = GGMLQuantizationType
# (name, n, k, types): Qwen2.5-0.5B and 7B projections, the 7B's also as its decode step runs them
# (q and k stacked, gate and up stacked, the output head).
SHAPES = [
    ("0.5b ffn_up", 4864, 896, (T.Q5_0, T.Q8_0)),
    ("7b ffn_up", 18944, 3584, (T.Q4_K, T.Q6_K)),
    ("7b ffn_down", 3584, 18944, (T.Q4_K, T.Q6_K)),
    ("7b q+k", 4096, 3584, (T.Q4_K,)),
    ("7b v", 512, 3584, (T.Q6_K,)),
    ("7b o", 3584, 3584, (T.Q4_K,)),
    ("7b gate+up", 37888, 3584, (T.Q4_K,)),
    ("7b lm_head", 152064, 3584, (T.Q6_K,)),
]
SMALL_SHAPES = [("small", 100, 512, (T.Q5_0, T.Q4_K)), ("small", 72, 768, (T.Q8_0, T.Q6_K))]
BATCHES = (16, 64, 256, 2048)
SMALL_BATCHES = (5, 40)
# y's rounding to bf16 is 2^-8 of |y| at most (2^-7 in the interpreter, which truncates); a wrong
# scale or nibble gives errors of the order of |y|.
MAX_REL_ERROR = 2.0**-6


@dataclass
class Env:
    device: str
    small: bool
    gen: torch.Generator
    failures: list[str]
    batches: tuple[int, ...] = BATCHES
    wide: bool = False


@dataclass
class Row:
    case: str
    m: int
    config: str
    us: float
    base_us: float
    deq_us: float
    matvec_us: float
    flops: float


def configs(qtype: GGMLQuantizationType, m: int, n: int, k: int, wide: bool = False) -> list[MatmulConfig]:
    """The default and the alternatives it was chosen from; `wide` (for M <= 64) adds a grid of W tile
    widths, K steps and warps in both operand orders."""
    base = default_config(qtype, m, n, k)
    if m <= 64 and wide:
        bm = base.block_m
        alts = [
            MatmulConfig(bm, bn, bk, warps, 3, swap_ab=swap)
            for swap in (False, True)
            for bn in (16, 32, 64, 128)
            for bk in (64, 128, 256)
            for warps in (4, 8)
            if bn * bk <= 16384 and not (warps == 8 and bn * bk < 4096)
        ]
    elif m <= 64:
        bm = base.block_m
        alts = [
            MatmulConfig(bm, 64, 128),
            MatmulConfig(bm, 128, 128),
            MatmulConfig(bm, 64, 64),
            MatmulConfig(bm, 32, 256),
            MatmulConfig(bm, 64, 128, swap_ab=True),
        ]
    else:
        alts = [
            MatmulConfig(128, 128, 64, 8, 3),
            MatmulConfig(64, 128, 64, 4, 4),
            MatmulConfig(128, 64, 128, 4, 3),
            MatmulConfig(128, 256, 64, 8, 3),
            MatmulConfig(256, 128, 64, 8, 3),
            MatmulConfig(128, 128, 128, 8, 3),
        ]
    if m <= 64:  # K split in 1-8 at the default tile (the default picks one by the tile count)
        alts += [replace(base, split_k=s) for s in (1, 2, 4, 8)]
    return [base] + [c for c in alts if c != base]


def cfg_name(c: MatmulConfig) -> str:
    swap = " swap" if c.swap_ab else ""
    split = f" split{c.split_k}" if c.split_k > 1 else ""
    return f"{c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages}{swap}{split}"


def bench_us(fn: Callable[[], object], small: bool) -> float:
    if small:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3


def dequant_matmul(x: torch.Tensor, packed: PackedQuantWeight) -> torch.Tensor:
    """QuantLinear's path from STRATA_DENSE_ROWS rows (64) on: the Triton decode to bf16, then cuBLAS."""
    return F.linear(x, dequantize_packed(packed, torch.bfloat16))


def run_case(name: str, n: int, k: int, qtype: GGMLQuantizationType, env: Env) -> list[Row]:
    device, gen = env.device, env.gen
    raw = random_weight(qtype, n, k, device, gen)
    packed = pack_quant_weight(raw, qtype, n, k)
    try:
        w16 = dequantize(raw, qtype, (n, k)).to(torch.bfloat16)
        deq_note = ""
    except Exception as e:  # noqa: BLE001 - reported, then the unfused path is timed from the CPU copy
        deq_note = f"strata.quant.dequantize failed on {device}: {e!r}"
        print(deq_note)
        w16 = dequantize(raw.cpu(), qtype, (n, k)).to(torch.bfloat16).to(device)
    case = f"{name} {qtype.name} {n}x{k}"
    rows = []
    for m in SMALL_BATCHES if env.small else env.batches:
        x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
        ref = x.float() @ w16.float().T
        ref_max = ref.abs().max().item()
        base_us = bench_us(partial(F.linear, x, w16), env.small)
        deq_us = bench_us(partial(dequant_matmul, x, packed), env.small)
        matvec_us = math.nan
        if m <= 16:
            matvec_us = bench_us(partial(quant_matvec, x, packed, qtype, n, k), env.small)
        best: Row | None = None
        for cfg in configs(qtype, m, n, k, env.wide):
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
            quant_matmul(x, packed, out=out, config=cfg)
            rel = (
                ((out.float() - ref).abs().max().item() / ref_max) if torch.isfinite(out).all() else math.inf
            )
            ok = rel <= MAX_REL_ERROR
            us = (
                bench_us(partial(quant_matmul, x, packed, out=out, config=cfg), env.small) if ok else math.nan
            )
            status = "ok" if ok else "FAIL"
            print(f"{case:28} M={m:5} {cfg_name(cfg):22} rel err {rel:.2e} {status:4} {us:9.1f} us  "
                  f"torch bf16 {base_us:9.1f} us  dequant+mm {deq_us:9.1f} us", flush=True)  # fmt: skip
            if not ok:
                env.failures.append(f"{case} M={m} {cfg_name(cfg)}: relative error {rel:.3g}")
            elif best is None or us < best.us:
                best = Row(case, m, cfg_name(cfg), us, base_us, deq_us, matvec_us, 2.0 * m * n * k)
        if best:
            rows.append(best)
    return rows


def table(rows: list[Row]) -> list[str]:
    def tf(us: float, flops: float) -> str:
        return f"{flops / us / 1e6:.0f}" if math.isfinite(us) else "-"

    lines = [
        "| weight | M | best config | us | TFLOP/s | torch bf16 us (TFLOP/s) | speed-up | "
        "dequant+mm us | speed-up | matvec us |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mv = f"{r.matvec_us:.1f}" if math.isfinite(r.matvec_us) else "-"
        lines.append(
            f"| {r.case} | {r.m} | {r.config} | {r.us:.1f} | {tf(r.us, r.flops)} | {r.base_us:.1f} "
            f"({tf(r.base_us, r.flops)}) | {r.base_us / r.us:.2f}x | {r.deq_us:.1f} | "
            f"{r.deq_us / r.us:.2f}x | {mv} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", action="store_true", help="tiny shapes in the interpreter on the CPU")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="values of M, e.g. 8,16,64")
    parser.add_argument("--shapes", default="", help="only weights whose name contains one of these, e.g. 7b")
    parser.add_argument("--types", default="", help="only these quant types, e.g. Q4_K")
    parser.add_argument("--wide", action="store_true", help="sweep many more tiles for M <= 64")
    args = parser.parse_args()
    if not args.small and not torch.cuda.is_available():
        parser.error("no CUDA device; use --small to check the script on the CPU")
    device = "cpu" if args.small else "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must be fp32
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 132
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter)"
    print(f"device {gpu}, {sms} SMs; torch {torch.__version__}, triton {triton.__version__}")
    batches = tuple(int(b) for b in args.batches.split(","))
    env = Env(device, args.small, torch.Generator(device=device).manual_seed(0), [], batches, args.wide)
    names, types = list(filter(None, args.shapes.split(","))), set(filter(None, args.types.split(",")))
    start = time.perf_counter()
    rows: list[Row] = []
    for name, n, k, qtypes in SMALL_SHAPES if env.small else SHAPES:
        if names and not any(part in name for part in names):
            continue
        for qtype in qtypes:
            if not types or qtype.name in types:
                rows += run_case(name, n, k, qtype, env)
    print(f"total {time.perf_counter() - start:.0f} s\n")
    print("\n".join(table(rows)))
    failures = env.failures
    print(f"checks: {len(failures)} failed" + "".join(f"\nFAILED {f}" for f in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
