"""Correctness, then speed, of the Triton kernels on the GPU: one call gives a tuning sweep.

    python benchmarks/gpu_kernels.py [--quick] [--only matvec|attention] [--smoke]

The GPU machine has no `gguf`; bring its pure-Python package (for example copy
.venv/lib/python3.11/site-packages/gguf into a folder on PYTHONPATH). `--smoke` runs tiny shapes in
Triton's interpreter on the CPU to check this script itself; its timings mean nothing.

For each kernel, type, shape and tile configuration: first the output is checked against the torch
reference on the device (strata.quant.dequantize then an fp32 matmul; a float32 softmax for
attention) on fresh random inputs with the output poisoned with NaN, and a failing configuration is
not timed. Then `triton.testing.do_bench` (warm-up, median; it clears L2 before every call, so the
weights come from HBM as in decode) times it. Effective GB/s counts the bytes that must move
(quantized W + x + y; K/V + q + out) over the time, and is also given as a fraction of 4.3 TB/s and
of the device-to-device copy measured in the same run. The torch baselines time only the matmul of
a weight dequantized once to bf16, and SDPA over contiguous (unpaged) K/V. Full logs and a JSON of
every row go to $OUT (or --out) when set; the short table is printed last. Exit status 1 if any
check failed. One eager launch at a time: for kernels of a few to tens of microseconds this mostly
times Python's launch path; `gpu_matvec_graph.py` and `gpu_attention_graph.py` time them in CUDA
graphs, as decode runs them (the 0.5B's attention at 32k: 27.7 us here, 18.2 us there).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import torch.nn.functional as F
import triton
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from strata.kernels.int8_inputs import int8_order
from strata.kernels.matvec_tiles import env_tile
from strata.kernels.paged_attention import choose_num_splits, paged_decode_attention
from strata.kernels.quant_matvec import MatvecConfig, auto_split_k, default_config, quant_matvec
from strata.kernels.quant_pack import PackedQuantWeight, pack_quant_weight
from strata.quant import dequantize

T = GGMLQuantizationType
PEAK_GBS = 4300.0
SCALE_OFFSETS = {T.Q8_0: (0,), T.Q5_0: (0,), T.Q4_0: (0,), T.Q4_K: (0, 2), T.Q6_K: (208,)}
TYPES = [T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K, T.Q4_0]
# (name, n, k): the default model (Qwen2.5-0.5B) and a 7B (Qwen2.5-7B).
MATVEC_SHAPES = [
    ("0.5b ffn_up", 4864, 896),
    ("0.5b ffn_down", 896, 4864),
    ("0.5b attn_q", 896, 896),
    ("0.5b lm_head", 151936, 896),
    ("7b ffn_up", 18944, 3584),
    ("7b ffn_down", 3584, 18944),
    ("7b attn_q", 3584, 3584),
]
# (name, heads, kv heads, head_dim, batch, context)
ATTENTION_CASES = [
    ("0.5b", 14, 2, 64, 1, 1024),
    ("0.5b", 14, 2, 64, 1, 8192),
    ("0.5b", 14, 2, 64, 1, 32768),
    ("0.5b", 14, 2, 64, 8, 8192),
    ("0.5b", 14, 2, 64, 32, 2048),
    ("7b", 28, 4, 128, 1, 1024),
    ("7b", 28, 4, 128, 1, 8192),
    ("7b", 28, 4, 128, 1, 32768),
    ("7b", 28, 4, 128, 8, 8192),
    ("7b", 28, 4, 128, 32, 2048),
]


@dataclass
class Row:
    kernel: str
    case: str
    variant: str
    ok: bool
    us: float = math.nan
    gbs: float = math.nan
    base_us: float = math.nan
    note: str = ""


class Log:
    def __init__(self, out_dir: Path | None) -> None:
        self.file = open(out_dir / "gpu_kernels.log", "w") if out_dir else None  # noqa: SIM115

    def __call__(self, msg: str) -> None:
        print(msg, flush=True)
        if self.file:
            self.file.write(msg + "\n")
            self.file.flush()


def bench_ms(fn: Callable[[], object], smoke: bool) -> float:
    if smoke:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def copy_ceiling_gbs(device: str, smoke: bool) -> float:
    n = (1 << 20) if smoke else (1 << 30)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), smoke)
    return 2 * n / ms / 1e6


def random_weight(
    qtype: GGMLQuantizationType, n: int, k: int, device: str, gen: torch.Generator
) -> torch.Tensor:
    """Random GGUF bytes with finite fp16 scales in [0.001, 0.1] of random sign, made on the device."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    num_blocks = n * k // block_size
    raw = torch.randint(0, 256, (num_blocks, type_size), dtype=torch.uint8, device=device, generator=gen)
    for off in SCALE_OFFSETS[qtype]:
        u = torch.rand(num_blocks, device=device, generator=gen)
        sign = torch.randint(0, 2, (num_blocks,), device=device, generator=gen) * 2 - 1
        scale = ((u * 0.099 + 0.001) * sign).to(torch.float16)
        raw[:, off : off + 2] = scale.view(torch.uint8).view(num_blocks, 2)
    return raw.view(-1)


def matvec_configs(packed: PackedQuantWeight, m: int, sms: int) -> list[MatvecConfig]:
    qtype, n, k = packed.qtype, packed.n, packed.k
    unit = {T.Q4_K: 64, T.Q6_K: 128}.get(qtype, 32)
    # The tile quant_matvec runs without a config (fp32 x here; STRATA_MATVEC_PRELOAD's included).
    out = [env_tile(default_config(qtype, m, n, k, sms), packed, m, False)]
    if m == 1:
        for bn, bk, warps in ((32, 256, 4), (16, 512, 8), (8, 256, 2)):
            bk = max(bk, unit)
            cfg = MatvecConfig(bn, bk, auto_split_k(n, k, bn, bk, sms), warps)
            if cfg not in out:
                out.append(cfg)
    return out


def cfg_name(c: MatvecConfig) -> str:
    return f"n{c.block_n} k{c.block_k} s{c.split_k} w{c.num_warps}"


def run_matvec(args: argparse.Namespace, device: str, sms: int, log: Log) -> list[Row]:
    rows: list[Row] = []
    gen = torch.Generator(device=device).manual_seed(0)
    shapes = [("smoke", 76, 256)] if args.smoke else MATVEC_SHAPES
    if args.quick:
        shapes = [s for s in shapes if s[0] in ("0.5b ffn_up", "0.5b ffn_down", "7b ffn_up", "7b ffn_down")]
    for name, n, k in shapes:
        for qtype in TYPES:
            if k % GGML_QUANT_SIZES[qtype][0] or (name.endswith("lm_head") and qtype != T.Q8_0):
                continue
            raw = random_weight(qtype, n, k, device, gen)
            # Q4_K planar, Q6_K in blocks: the tiles a MatvecConfig launches (the rows kernels:
            # gpu_q4k_rows.py).
            packed = pack_quant_weight(raw, qtype, n, k, "planar", q6k_layout="blocks")
            w32 = dequantize(raw, qtype, (n, k))
            w16 = w32.to(torch.bfloat16)
            for m in (1,) if name.endswith("lm_head") else (1, 16) if args.smoke else (1, 4, 16):
                x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
                ref = x.float() @ w32.T
                tol = torch.finfo(torch.bfloat16).eps * ref.abs() + 1e-5 * (x.float().abs() @ w32.abs().T)
                if int8_order(packed) is not None:  # bf16 x quantized per 32 to int8 (STRATA_INT8_X)
                    dx = x.float().view(m, -1, 32).abs().amax(-1, keepdim=True) / 127
                    tol += (dx / 2).expand(-1, -1, 32).reshape(m, k) @ w32.abs().T
                base_ms = bench_ms(partial(F.linear, x, w16), args.smoke)
                moved = packed.nbytes + x.numel() * 2 + m * n * 2
                case = f"{name} {n}x{k} M={m}"
                for cfg in matvec_configs(packed, m, sms):
                    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
                    quant_matvec(x, packed, qtype, n, k, out=out, config=cfg)
                    err = (out.float() - ref).abs()
                    ok = bool(torch.isfinite(out).all()) and bool((err <= tol).all())
                    row = Row("matvec " + qtype.name, case, cfg_name(cfg), ok, base_us=base_ms * 1e3)
                    if ok:
                        fn = partial(quant_matvec, x, packed, qtype, n, k, out=out, config=cfg)
                        ms = bench_ms(fn, args.smoke)
                        row.us, row.gbs = ms * 1e3, moved / ms / 1e6
                    else:
                        row.note = f"FAIL: max error/tol {(err / tol).nan_to_num(1e30).max().item():.3g}"
                    rows.append(row)
                    log(f"{row.kernel:12} {case:32} {row.variant:18} ok={ok} {row.us:9.2f} us "
                        f"{row.gbs:8.1f} GB/s torch-bf16 {row.base_us:9.2f} us {row.note}")  # fmt: skip
            del raw, packed, w32, w16
    return rows


def attention_reference(q: torch.Tensor, k_seq: torch.Tensor, v_seq: torch.Tensor) -> torch.Tensor:
    """float32 softmax attention of q (batch, heads, dim) over contiguous K/V (batch, kv_heads, ctx,
    dim), scaled by 1/sqrt(dim); GQA by repeating each KV head for its query heads."""
    g = q.shape[1] // k_seq.shape[1]
    s = torch.einsum("bhd,bhtd->bht", q.float(), k_seq.float().repeat_interleave(g, 1)) * q.shape[2] ** -0.5
    return torch.einsum("bht,bhtd->bhd", s.softmax(-1), v_seq.float().repeat_interleave(g, 1))


def run_attention(args: argparse.Namespace, device: str, sms: int, log: Log) -> list[Row]:
    rows: list[Row] = []
    gen = torch.Generator(device=device).manual_seed(1)
    cases = (
        [(n, h, kvh, d // 4, b, min(c, 300)) for n, h, kvh, d, b, c in ATTENTION_CASES[:3]]
        if args.smoke
        else ATTENTION_CASES
    )
    if args.quick:
        cases = [c for c in cases if c[4] == 1 or c[5] == 2048]
    block_size = 16
    for name, heads, kv_heads, dim, batch, ctx in cases:
        blocks_per_seq = triton.cdiv(ctx, block_size)
        num_blocks = batch * blocks_per_seq
        perm = torch.randperm(num_blocks, device=device, generator=gen).view(batch, blocks_per_seq)
        tables = perm.to(torch.int32)
        lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
        shape = (num_blocks * block_size, kv_heads, dim)
        k_cache = torch.randn(shape, device=device, generator=gen).to(torch.bfloat16)
        v_cache = torch.randn(shape, device=device, generator=gen).to(torch.bfloat16)
        q = torch.randn(batch, heads, dim, device=device, generator=gen).to(torch.bfloat16)
        pos = torch.arange(ctx, device=device)
        slots = perm[:, pos // block_size] * block_size + pos % block_size  # (batch, ctx)
        k_seq = k_cache[slots].permute(0, 2, 1, 3).contiguous()  # (batch, kv_heads, ctx, dim)
        v_seq = v_cache[slots].permute(0, 2, 1, 3).contiguous()
        scale = dim**-0.5
        ref = attention_reference(q, k_seq, v_seq)
        ref_scale = ref.abs().flatten(1).amax(1)
        q4 = q.unsqueeze(2)
        sdpa = partial(F.scaled_dot_product_attention, q4, k_seq, v_seq, scale=scale, enable_gqa=True)
        base_ms = bench_ms(sdpa, args.smoke)
        moved = 2 * k_cache[: batch * ctx].numel() * 2 + 2 * q.numel() * 2
        case = f"{name} H{heads}/{kv_heads} D{dim} B={batch} ctx={ctx}"
        auto = choose_num_splits(batch, kv_heads, ctx, sms)
        variants = [(auto, 64), (auto, 128), (auto, 32), (min(128, 2 * auto), 64), (max(1, auto // 2), 64)]
        for splits, block_t in dict.fromkeys(variants):
            out = torch.full_like(q, float("nan"))
            run = partial(
                paged_decode_attention, q, k_cache, v_cache, tables, lens, block_size=block_size, scale=scale,
                num_splits=splits, max_context_len=ctx, out=out, block_t=block_t,
            )  # fmt: skip
            run()
            rel = ((out.float() - ref).abs().flatten(1).amax(1) / ref_scale).max().item()
            ok = bool(torch.isfinite(out).all()) and rel <= 4 * torch.finfo(torch.bfloat16).eps
            tag = "auto " if splits == auto else ""
            row = Row("attention", case, f"{tag}splits {splits} t{block_t}", ok, base_us=base_ms * 1e3)
            if ok:
                ms = bench_ms(run, args.smoke)
                row.us, row.gbs = ms * 1e3, moved / ms / 1e6
            else:
                row.note = f"FAIL: relative error {rel:.3g}"
            rows.append(row)
            log(f"{row.kernel:12} {case:38} {row.variant:18} ok={ok} {row.us:9.2f} us {row.gbs:8.1f} GB/s "
                f"sdpa {row.base_us:9.2f} us {row.note}")  # fmt: skip
        del k_cache, v_cache, k_seq, v_seq
    return rows


def summary(rows: list[Row], ceiling: float) -> list[str]:
    """Per (kernel, case): the best configuration, its bandwidth fractions and the speed-up over torch."""
    best: dict[tuple[str, str], Row] = {}
    failed = [r for r in rows if not r.ok]
    for r in rows:
        key = (r.kernel, r.case)
        if r.ok and (key not in best or r.us < best[key].us):
            best[key] = r
    lines = [
        f"copy ceiling measured now: {ceiling:.0f} GB/s ({ceiling / PEAK_GBS:.0%} of {PEAK_GBS:.0f})",
        "| kernel | case | best config | us | GB/s | of 4.3 TB/s | of copy | torch us | speed-up |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (kernel, case), r in best.items():
        lines.append(
            f"| {kernel} | {case} | {r.variant} | {r.us:.1f} | {r.gbs:.0f} | {r.gbs / PEAK_GBS:.0%} | "
            f"{r.gbs / ceiling:.0%} | {r.base_us:.1f} | {r.base_us / r.us:.2f}x |"
        )
    lines.append(f"checks: {len(rows) - len(failed)} passed, {len(failed)} failed")
    lines += [f"FAILED {r.kernel} {r.case} {r.variant}: {r.note}" for r in failed]
    return lines


def add_smoke_and_out(parser: argparse.ArgumentParser) -> None:
    """--smoke (the interpreter on the CPU) and --out (default $OUT), as the GPU scripts take them."""
    parser.add_argument("--smoke", action="store_true", help="tiny shapes in the interpreter on the CPU")
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    )


def smoke_or_cuda(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The device of the run: "cpu" under --smoke, else "cuda" (an argument error without one)."""
    if not args.smoke and not torch.cuda.is_available():
        parser.error("no CUDA device; use --smoke to check the script on the CPU")
    return "cpu" if args.smoke else "cuda"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer shapes (about half the time)")
    parser.add_argument("--only", choices=["matvec", "attention"], help="run one kernel family")
    add_smoke_and_out(parser)
    args = parser.parse_args()
    device = smoke_or_cuda(parser, args)
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 references must be fp32
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 132
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter)"
    log(f"device {name}, {sms} SMs; torch {torch.__version__}, triton {triton.__version__}")
    start = time.perf_counter()
    ceiling = copy_ceiling_gbs(device, args.smoke)
    log(f"device-to-device copy: {ceiling:.0f} GB/s")
    rows = []
    if args.only in (None, "matvec"):
        rows += run_matvec(args, device, sms, log)
    if args.only in (None, "attention"):
        rows += run_attention(args, device, sms, log)
    table = summary(rows, ceiling)
    log(f"total {time.perf_counter() - start:.0f} s\n")
    for line in table:
        log(line)
    if args.out:
        (args.out / "gpu_kernels.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
