"""Paged decode attention as decode runs it: in a CUDA graph, one cache per layer, per launch config.

    python benchmarks/gpu_attention_graph.py [--cases 0.5b-32k,7b-32k] [--splits 32,64,128,256]
        [--block-t 32,64,128] [--warps 2,4,8] [--stages 0,2,3,4] [--min-split-len 1,128]
        [--bound 32768] [--out DIR]
    python benchmarks/gpu_attention_graph.py --smoke     # the script itself, in Triton's interpreter

`gpu_kernels.py` times one eager launch pair (split kernel + merge) at a time, which at 20-30 us
also measures Python's launch path. Decode replays graphs, and a step's layers each read their own
K/V (the 0.5B at 32k: 24 layers of 16 MB, well past the 50 MB L2). So here each config is captured
as a graph of one call per layer, each on its own cache, and the median replay time over the calls
is the per-layer figure. Every config is first checked against a float32 softmax reference on fresh
random inputs, output poisoned with NaN; a failing config is not timed. By default (`--min-split-len
1`, as the engine runs them) a sequence uses as many splits as its context fills at a tile each (the
kernel floors min_split_len at block_t); a larger min_split_len caps its live splits at cdiv(context,
it), as STRATA_LIVE_SPLITS does. Stage 0 stands for Triton's default. `--bound N` chooses the "before"
split count for contexts of up to N positions, as a CUDA graph does for every context up to the
sequence's most positions (the 0.5B at 640 positions then launches 64 splits, of which 5 hold a tile
of 128 positions and the rest return at once); without it, for the case's context.

The table lists per case the launch that was the default until 2026-12-06 (choose_num_splits,
block_t 64, 4 warps, Triton's default stages; since then `default_launch` picks block_t 128 in two
stages where it fits), the best config, both in us per layer, and the best's GB/s of K/V read
(the copy ceiling measured in the run is printed above the table).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from functools import partial
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton

sys.path.insert(0, str(Path(__file__).parent))
from gpu_kernels import add_smoke_and_out, attention_reference, copy_ceiling_gbs, smoke_or_cuda  # noqa: E402
from gpu_matvec_graph import graph_call_us  # noqa: E402

from strata.kernels.paged_attention import choose_num_splits, paged_decode_attention  # noqa: E402

# name: (heads, kv_heads, head_dim, layers, batch, context)
CASES = {
    "0.5b-1k": (14, 2, 64, 24, 1, 1024),
    "0.5b-8k": (14, 2, 64, 24, 1, 8192),
    "0.5b-32k": (14, 2, 64, 24, 1, 32768),
    "0.5b-32k-b4": (14, 2, 64, 24, 4, 32768),
    "1.5b-32k": (12, 2, 128, 28, 1, 32768),
    "7b-32k": (28, 4, 128, 28, 1, 32768),
    "7b-8k-b8": (28, 4, 128, 28, 8, 8192),
    "0.5b-2k-b32": (14, 2, 64, 24, 32, 2048),
    "7b-1k": (28, 4, 128, 28, 1, 1024),
    "7b-2k-b32": (28, 4, 128, 28, 32, 2048),
    # The contexts of `strata bench`'s decode (-p 512 -n 128) and its 64 sequences (-p 128 -n 64).
    "0.5b-640": (14, 2, 64, 24, 1, 640),
    "7b-640": (28, 4, 128, 28, 1, 640),
    "7b-192-b64": (28, 4, 128, 28, 64, 192),
}
SMOKE_CASES = {"smoke": (4, 2, 16, 2, 2, 300)}
BLOCK_SIZE = 16
L2_BYTES = 50 << 20


def make_layers(heads: int, kv_heads: int, dim: int, layers: int, batch: int, ctx: int, device: str):
    """q, block tables, lengths and one (k, v) cache per layer (only as many layers as it takes to
    read 3x the L2 from HBM, the rest of the graph's calls reuse them in turn)."""
    gen = torch.Generator(device=device).manual_seed(0)
    blocks = triton.cdiv(ctx, BLOCK_SIZE)
    tables = torch.randperm(batch * blocks, device=device, generator=gen).view(batch, blocks).to(torch.int32)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    shape = (batch * blocks * BLOCK_SIZE, kv_heads, dim)
    layer_bytes = 2 * shape[0] * kv_heads * dim * 2
    copies = max(1, min(layers, triton.cdiv(3 * L2_BYTES, layer_bytes)))
    caches = [
        (
            torch.randn(shape, device=device, generator=gen).to(torch.bfloat16),
            torch.randn(shape, device=device, generator=gen).to(torch.bfloat16),
        )
        for _ in range(copies)
    ]
    q = torch.randn(batch, heads, dim, device=device, generator=gen).to(torch.bfloat16)
    return q, tables, lens, caches


def reference(q, k_cache, v_cache, tables, ctx: int) -> torch.Tensor:
    """float32 attention over each sequence's ctx positions, gathered from the paged cache."""
    pos = torch.arange(ctx, device=q.device)
    slots = tables[:, pos // BLOCK_SIZE].long() * BLOCK_SIZE + pos % BLOCK_SIZE  # (batch, ctx)
    k_seq, v_seq = (cache[slots].permute(0, 2, 1, 3) for cache in (k_cache, v_cache))
    return attention_reference(q, k_seq, v_seq)


def sweep_case(name: str, shape: tuple, configs: list[tuple], device: str, chosen: int) -> tuple[list, str]:
    """Each config (splits, block_t, warps, stages, min_split_len) checked, then timed, after the launch
    from before at `chosen` splits: the results and the case's table row."""
    heads, kv_heads, dim, layers, batch, ctx = shape
    q, tables, lens, caches = make_layers(heads, kv_heads, dim, layers, batch, ctx, device)
    ref = reference(q, *caches[0], tables, ctx)
    tol = 4 * torch.finfo(torch.bfloat16).eps * ref.abs().max().item()
    out = torch.empty_like(q)
    results, timed = [], {}
    for config in dict.fromkeys([(chosen, 64, 4, 0, 1), *configs]):
        n, block_t, warps, stages, min_len = config
        launch = partial(
            paged_decode_attention, q, block_tables=tables, context_lens=lens, block_size=BLOCK_SIZE,
            num_splits=n, max_context_len=ctx, out=out, block_t=block_t, num_warps=warps,
            num_stages=stages or None, min_split_len=min_len,
        )  # fmt: skip

        def run(i: int, launch=launch) -> None:
            k, v = caches[i % len(caches)]
            launch(k_cache=k, v_cache=v)

        out.fill_(float("nan"))
        try:
            run(0)
            err = (out.float() - ref).abs().max().item()
        except Exception as exc:  # noqa: BLE001 (a config that does not compile or fit is reported)
            print(f"{name} {config}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        if not err <= tol:
            print(f"{name} {config}: FAIL error {err:.3g} > {tol:.3g}")
            results.append({"case": name, "config": config, "ok": False, "error": err})
            continue
        timed[config] = graph_call_us(run, layers) if device == "cuda" else 0.0
        results.append({"case": name, "config": config, "ok": True, "us": timed[config]})
        print(f"{name} splits {n} t{block_t} w{warps} s{stages} m{min_len}: {timed[config]:8.2f} us")
    if not timed:
        return results, f"| {name} | no config ran |"
    base = timed.get((chosen, 64, 4, 0, 1), float("nan"))
    best = min(timed, key=lambda c: timed[c])
    us = timed[best] or float("nan")
    gbs = 2 * batch * ctx * kv_heads * dim * 2 / us / 1e3  # K and V, bf16
    row = (
        f"| {name} | splits {chosen} t64 w4 | {base:.2f} | splits {best[0]} t{best[1]} w{best[2]} "
        f"s{best[3]} m{best[4]} | {us:.2f} | {base / us:.2f}x | {gbs:.0f} |"
    )
    return results, row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    parser.add_argument("--splits", default="", help="split counts (default: the chosen one x 1/2, 1, 2, 4)")
    parser.add_argument("--block-t", default="32,64,128")
    parser.add_argument("--warps", default="2,4,8")
    parser.add_argument("--stages", default="0,2,3,4", help="0: Triton's default")
    parser.add_argument("--min-split-len", default="1", help="positions a live split takes at least")
    parser.add_argument("--bound", type=int, default=0, help="choose the split count for this many positions")
    add_smoke_and_out(parser)
    args = parser.parse_args()
    device = smoke_or_cuda(parser, args)
    cases = SMOKE_CASES if args.smoke else {name: CASES[name] for name in args.cases.split(",")}
    if args.smoke:  # a few configs: each one is interpreted
        args.block_t, args.warps, args.stages, args.min_split_len = "16,32", "4", "2", "1,64"
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 132
    ceiling = copy_ceiling_gbs(device, args.smoke)
    print(f"device {torch.cuda.get_device_name(0) if device == 'cuda' else 'cpu'}; copy {ceiling:.0f} GB/s")
    results, table = [], []
    for name, shape in cases.items():
        _, kv_heads, _, _, batch, ctx = shape
        chosen = choose_num_splits(batch, kv_heads, max(ctx, args.bound), sms)
        splits = ints(args.splits) or sorted({max(1, chosen // 2), chosen, 2 * chosen, 4 * chosen})
        grid = itertools.product(
            splits, ints(args.block_t), ints(args.warps), ints(args.stages), ints(args.min_split_len)
        )
        case_results, row = sweep_case(name, shape, list(grid), device, chosen)
        results += case_results
        table.append(row)
    print(f"\ncopy ceiling {ceiling:.0f} GB/s")
    print("| case | before | us | best | us | speed-up | GB/s |\n|---|---|---|---|---|---|---|")
    print("\n".join(table))
    failed = sum(not r["ok"] for r in results)
    print(f"checks: {len(results) - failed} passed, {failed} failed")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "attention_graph.json").write_text(json.dumps(results, indent=1))
    return 0 if results and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
