"""One fused matvec launched a few times, for Nsight Compute to profile the last launch.

    ncu -k regex:matvec --launch-skip 3 --launch-count 1 --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section LaunchStats python3 benchmarks/ncu_matvec.py Q4_K 37888 3584 \\
        [--layout planar] [--config 16,512,1,4,0]

The config is block_n,block_k,split_k,num_warps,prefetch (default: the launcher's own choice).
`--m` sets the activation rows; `--matmul` launches the fused tensor-core matmul instead (its default
tile for that M; `-k regex:matmul`).
Reading the counters answers what the in-graph sweep cannot: achieved occupancy, DRAM throughput
and why warps stall (memory latency against instruction issue).
"""

from __future__ import annotations

import argparse

import torch
from gguf.constants import GGMLQuantizationType

from strata.kernels.quant_matmul import quant_matmul
from strata.kernels.quant_matvec import MatvecConfig, quant_matvec
from strata.kernels.quant_pack import pack_quant_weight


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("qtype")
    p.add_argument("n", type=int)
    p.add_argument("k", type=int)
    p.add_argument("--layout", default="blocks")
    p.add_argument("--config", default="")
    p.add_argument("--launches", type=int, default=4)
    p.add_argument("--m", type=int, default=1)
    p.add_argument("--matmul", action="store_true")
    args = p.parse_args()
    qtype = GGMLQuantizationType[args.qtype]
    from gpu_kernels import random_weight  # benchmarks/ is the script's folder, first on sys.path

    gen = torch.Generator(device="cuda").manual_seed(0)
    raw = random_weight(qtype, args.n, args.k, "cuda", gen)
    # --layout names Q6_K's layout too ("blocks" or "rows"; Q4_K's others leave Q6_K in blocks).
    q6k_layout = "rows" if args.layout == "rows" else "blocks"
    w = pack_quant_weight(raw, qtype, args.n, args.k, args.layout, q6k_layout=q6k_layout)
    cfg = None
    if args.config:
        bn, bk, split, warps, prefetch = (int(v) for v in args.config.split(","))
        cfg = MatvecConfig(bn, bk, split, warps, bool(prefetch))
    x = torch.randn(args.m, args.k, device="cuda", generator=gen).to(torch.bfloat16)
    for _ in range(args.launches):
        if args.matmul:
            quant_matmul(x, w)
        else:
            quant_matvec(x, w, qtype, args.n, args.k, config=cfg)
    torch.cuda.synchronize()
    what = "matmul" if args.matmul else cfg
    print(f"{args.qtype} {args.layout} ({args.n}, {args.k}) M={args.m} {what}: {w.nbytes / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
