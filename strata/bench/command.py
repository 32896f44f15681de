"""The `strata bench` arguments and their dispatch: the edge where Namespace becomes frozen configs.

Kept free of heavy imports: `strata.cli` builds this parser on every invocation.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ARM_HELP = (
    "KIND[@REV][:key=value,...]; KIND is strata, llamacpp or transformers (e.g. strata@HEAD~1:threads=1)"
)


def add_arguments(bench: argparse.ArgumentParser, model_help: str, default_model: str) -> None:
    """Fill the `strata bench` parser with its three subcommands."""
    modes = bench.add_subparsers(dest="bench_command", required=True)
    decode = modes.add_parser("decode", help="tok/s decoding N tokens after a P-token prompt")
    prefill = modes.add_parser("prefill", help="prompt tok/s for a P-token prompt")
    ab = modes.add_parser("ab", help="paired A/B runs of two arms, with a same-tokens gate")
    for p in (decode, prefill):
        p.add_argument("--arm", default="strata", help=ARM_HELP + " (default strata)")
        p.add_argument("--repeats", type=int, default=3)
    ab.add_argument("arm_a", metavar="A", help=ARM_HELP)
    ab.add_argument("arm_b", metavar="B", help="the other arm; ratios are B/A")
    ab.add_argument(
        "--mode", choices=("decode", "prefill"), default="decode", help="decode also times prefill"
    )
    ab.add_argument("--pairs", type=int, default=5)
    ab.add_argument("--order", choices=("abba", "abab"), default="abba")
    ab.add_argument(
        "--gate",
        choices=("auto", "identical", "self"),
        default="auto",
        help="identical: both arms emit the same ids; self: each arm repeats itself (auto: identical "
        "for two strata arms of one dtype, else self)",
    )
    for p in (decode, prefill, ab):
        p.add_argument("--model", default=default_model, help=model_help)
        p.add_argument("-p", "--prompt-tokens", type=int, default=128)
        p.add_argument("-d", "--depth", type=int, default=0, help="tokens already in the KV cache (untimed)")
        p.add_argument("-b", "--batch", type=int, default=1, help="sequences run together")
        p.add_argument("--seed", type=int, default=0, help="seed of the random prompt token ids")
        p.add_argument("--threads", type=int, default=None, help="CPU threads per arm (default: all cores)")
        p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
        p.add_argument(
            "--tensor-parallel",
            type=int,
            default=1,
            metavar="N",
            help="strata arms run on N ranks (processes; one GPU each on cuda), unless an arm sets "
            "tensor_parallel=N itself",
        )
        p.add_argument("--warmup", type=int, default=1, help="warm-up runs per arm")
        p.add_argument("--settle", type=float, default=0.5, help="seconds of pause before each run")
        p.add_argument("--out", type=Path, default=None, help="output folder (default bench-out/<time>)")
    for p in (decode, ab):
        p.add_argument("-n", "--new-tokens", type=int, default=32)


def main(args: argparse.Namespace) -> int:
    from strata import env
    from strata.model_store import resolve_model

    from .ab import ABConfig, run_ab
    from .arms import ArmSpec
    from .process import WorkerFailed
    from .session import BenchConfig, default_out
    from .single import run_single
    from .workload import Workload

    mode = args.mode if args.bench_command == "ab" else args.bench_command
    workload = Workload(
        mode=mode,
        prompt_len=args.prompt_tokens,
        new_tokens=getattr(args, "new_tokens", 0),
        depth=args.depth,
        batch=args.batch,
        seed=args.seed,
    )
    if args.device == "cuda":  # checked before the model is resolved: the message should come first
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: torch sees no CUDA GPU on this machine; use --device cpu")
    bench = BenchConfig(
        model=resolve_model(args.model),
        workload=workload,
        threads=args.threads or env.num_threads() or os.cpu_count() or 1,
        out=args.out or default_out(args.bench_command),
        device=args.device,
        warmup=args.warmup,
        settle_s=args.settle,
        argv=tuple(sys.argv),
        tensor_parallel=args.tensor_parallel,
    )
    try:
        if args.bench_command == "ab":
            config = ABConfig(
                bench, ArmSpec.parse(args.arm_a), ArmSpec.parse(args.arm_b), args.pairs, args.order, args.gate
            )
            return run_ab(config)
        return run_single(bench, ArmSpec.parse(args.arm), args.repeats)
    except WorkerFailed as e:
        print(f"strata: error: {e}", file=sys.stderr)
        return 2
