"""The GPU engine end to end on synthetic models in the real layouts: parity first, then speed.

    python benchmarks/gpu_engine.py [--layouts 0.5b,1.5b,7b] [--cases decode,prefill,long,batch]
                                    [--repeats 3] [--out DIR]

1. Parity: the tiny layouts (the 0.5B's Q5_0/Q8_0 mix and the 1.5B's Q4_K/Q6_K mix) decode 64
   greedy tokens for two prompts on the CPU reference (float32) and on the GPU in float32 through
   the kernels and CUDA graphs; the token ids must be equal. The GPU in bfloat16 with and without
   CUDA graphs must also agree with itself (same kernels, same order).
2. Speed: each layout is written with `strata synth` (random weights, real names, shapes and quant
   types), then strata's bench runner (`strata bench`'s worker, in process) times, in bfloat16:
   decode (prompt 512, 128 tokens: llama-bench's tg128 after pp512), prefill of 2,048 tokens, the
   0.5B decoding at a context depth of 32,000, and decode of 64 sequences together. Each case runs
   once to warm up, then `--repeats` times; the median is reported with llama.cpp's figures from
   ../shared/GPU.md and the ratio to them.

Exit status 1 if a parity check fails. The short table is printed last; JSON goes to --out/$OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from strata.bench.runners import StrataRunner, WorkerConfig
from strata.bench.workload import Workload, make_prompts, plain_token_ids
from strata.gguf.reader import GGUFFile
from strata.synth.layouts import load_layout
from strata.synth.writer import write_layout

sys.path.insert(0, str(Path(__file__).parent))  # benchmarks/, also when imported by the tests
from gpu_kernels import copy_ceiling_gbs  # noqa: E402
from weight_traffic import bandwidth_lines, bytes_by_kernel  # noqa: E402

# llama.cpp on the same H200 (../shared/GPU.md): tok/s.
PEER = {
    ("0.5b", "decode"): 894, ("1.5b", "decode"): 585, ("7b", "decode"): 263,
    ("0.5b", "prefill"): 47_204, ("1.5b", "prefill"): 26_790, ("7b", "prefill"): 9_558,
    ("0.5b", "long"): 616, ("7b", "batch"): 4_478, ("0.5b", "batch"): 9_800,
}  # fmt: skip
CASES = {
    "decode": Workload("decode", prompt_len=512, new_tokens=128),
    "prefill": Workload("prefill", prompt_len=2048),
    "long": Workload("decode", prompt_len=64, new_tokens=128, depth=32_000),
    "batch": Workload("decode", prompt_len=128, new_tokens=128, batch=64),
}
LONG_ONLY = {"long": ("0.5b",), "batch": ("0.5b", "7b")}


def synth(name: str, folder: Path) -> Path:
    path = folder / f"{name}.gguf"
    if not path.exists():
        stats = write_layout(path, load_layout(name), seed=0, threads=os.cpu_count())
        print(f"synth {name}: {stats.nbytes / 1e9:.2f} GB in {stats.seconds:.1f} s", flush=True)
    return path


def runner(path: Path, device: str, dtype: str, graphs: bool = True, prefill: bool = True) -> StrataRunner:
    options = {"dtype": dtype, "cuda_graphs": "1" if graphs else "0", "prefill_kernel": str(int(prefill))}
    config = WorkerConfig("strata", str(path), options, threads=os.cpu_count() or 1, device=device)
    return StrataRunner(config)


def prompts_for(path: Path, workload: Workload) -> list[list[int]]:
    types = GGUFFile(path).metadata["tokenizer.ggml.token_type"]
    return make_prompts(workload, plain_token_ids(types))


def parity(folder: Path) -> list[dict[str, object]]:
    rows = []
    workload = Workload("decode", prompt_len=40, new_tokens=63, batch=2, seed=3)
    for name in ("qwen2.5-0.5b-tiny", "qwen2.5-1.5b-tiny"):
        path = synth(name, folder)
        prompts = prompts_for(path, workload)
        ref = runner(path, "cpu", "float32").run(workload, prompts).tokens
        gpu32 = runner(path, "cuda", "float32", prefill=False).run(workload, prompts).tokens
        gpu32_prefill = runner(path, "cuda", "float32").run(workload, prompts).tokens
        bf16 = runner(path, "cuda", "bfloat16").run(workload, prompts).tokens
        bf16_eager = runner(path, "cuda", "bfloat16", graphs=False).run(workload, prompts).tokens
        for label, a, b in (
            ("cpu f32 vs gpu f32, reference prefill", ref, gpu32),
            ("cpu f32 vs gpu f32, paged prefill kernel", ref, gpu32_prefill),
            ("gpu bf16 graphs vs eager", bf16, bf16_eager),
        ):
            equal = a == b
            first = next(
                (i for i, (x, y) in enumerate(zip(a[0] + a[1], b[0] + b[1], strict=True)) if x != y), None
            )
            rows.append({"layout": name, "check": label, "equal": equal, "first_diff": first,
                         "tokens": sum(map(len, a))})  # fmt: skip
            print(f"parity {name} {label}: {'equal' if equal else f'DIFFER at {first}'}", flush=True)
        agree = sum(x == y for x, y in zip(ref[0] + ref[1], bf16[0] + bf16[1], strict=True))
        print(f"  cpu f32 vs gpu bf16: {agree}/{sum(map(len, ref))} ids agree (informative)", flush=True)
    return rows


def speed(folder: Path, layouts: list[str], cases: list[str], repeats: int) -> list[dict[str, object]]:
    rows = []
    for short in filter(None, layouts):  # --layouts "" times nothing (a profile-only run)
        path = synth(f"qwen2.5-{short}", folder)
        run = runner(path, "cuda", "bfloat16")
        for case in cases:
            if case in LONG_ONLY and short not in LONG_ONLY[case]:
                continue
            workload = CASES[case]
            prompts = prompts_for(path, workload)
            try:
                rows.append(measure(run, short, case, workload, prompts, repeats))
            except Exception:  # one broken case should not hide the others' figures
                traceback.print_exc()
        del run
        torch.cuda.empty_cache()
    return rows


def measure(
    run: StrataRunner, short: str, case: str, workload: Workload, prompts: list[list[int]], repeats: int
) -> dict[str, object]:
    times, tokens = [], None
    for i in range(repeats + 1):
        t = time.perf_counter()
        m = run.run(workload, prompts)
        wall = time.perf_counter() - t
        if i == 0:
            tokens = m.tokens
            continue
        if m.tokens != tokens:
            print(f"  {short} {case}: run {i} emitted other tokens than the warm-up", flush=True)
        if workload.mode == "prefill":
            times.append(workload.batch * workload.prompt_len / m.prefill_s)
        else:
            times.append(workload.batch * workload.new_tokens / m.decode_s)
        print(f"  {short} {case} run {i}: {times[-1]:,.0f} tok/s (wall {wall:.1f} s)", flush=True)
    value = statistics.median(times)
    peer = PEER.get((short, case))
    return {"layout": short, "case": case, "tok_s": value, "runs": times, "peer": peer,
            "ratio": value / peer if peer else None}  # fmt: skip


def profile_kernels(folder: Path, short: str, out: Path | None, prefill: int = 0, batch: int = 1) -> None:
    """Kernel time per decode step of `batch` sequences, eager (no graphs) so the profiler sees each
    launch: the sum of GPU time per step is what a captured graph cannot go below. Only the second
    half of the decode steps counts, so the prompts' prefill is left out. With `prefill`, the
    kernels of a prefill of that many tokens instead (one "step")."""
    path = synth(f"qwen2.5-{short}", folder)
    run = runner(path, "cuda", "bfloat16", graphs=False)
    if prefill:
        workload = Workload("prefill", prompt_len=prefill)
    else:
        workload = Workload("decode", prompt_len=128 if batch > 1 else 8, new_tokens=32, batch=batch)
    prompts = prompts_for(path, workload)
    run.run(workload, prompts)
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        run.run(workload, prompts)
    events, ends = device_events(prof)
    kernels, steps = events, 1
    if not prefill and len(ends) >= 3:  # the steps from the middle argmax to the last
        steps = len(ends) - 1 - len(ends) // 2
        kernels = events[ends[len(ends) // 2] + 1 : ends[-1] + 1]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
    total = sum(map(sum, by_name.values())) / steps
    what = f"prefill of {prefill}" if prefill else f"step of {batch} sequence(s) ({steps} steps)"
    lines = [f"{short}: {total:,.0f} us of kernels and {len(kernels) / steps:,.0f} launches per {what}"]
    lines += [f"  {sum(t) / steps:8.1f} us {len(t) / steps:6.1f}x  {name[:90]}" for name, t in ranked[:16]]
    if not prefill and batch == 1:  # each matvec kernel's weights against its time
        us_a_step = {name: sum(t) / steps for name, t in by_name.items()}
        ceiling = copy_ceiling_gbs("cuda", False)
        lines += ["", *bandwidth_lines(us_a_step, bytes_by_kernel(packed_weights(run)), ceiling)]
    step = [] if prefill else one_step(events, ends)
    if step:
        order = f"in order (the first 32 and the last 8 of {len(step)})"
        lines += ["", f"{short}: one decode step's kernels {order}"]
        lines += step[:32] + ["  ..."] + step[-8:]
    text = "\n".join(lines)
    print(text, flush=True)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        table = prof.key_averages().table(row_limit=60)
        name = f"profile_{short}{'_prefill' if prefill else ''}{f'_b{batch}' if batch > 1 else ''}.txt"
        (out / name).write_text(text + "\n\n" + table + "\n\n" + "\n".join(step))


def packed_weights(run: StrataRunner) -> list:
    """The packed weights of the runner's model that decode matvecs read (its QuantLinear layers')."""
    from strata.layers.linear import QuantLinear

    return [m.packed for m in run.llm.model.modules() if isinstance(m, QuantLinear) and m.packed is not None]


def device_events(prof: torch.profiler.profile) -> tuple[list, list[int]]:
    """The profile's kernels (and memcpys) in launch order, and the indices of the greedy sampler's
    argmax kernels among them (each greedy step ends in one)."""
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: e.time_range.start)
    return kernels, [i for i, e in enumerate(kernels) if "ArgMax" in e.name]


def one_step(kernels: list, ends: list[int]) -> list[str]:
    """The kernels of one decode step in launch order with their times (`device_events`): those
    between the argmax of the middle step and the next one."""
    if len(ends) < 3:
        return [f"  (no step boundaries found among {len(kernels)} kernel events)"]
    mid = len(ends) // 2
    return [
        f"  {e.time_range.elapsed_us():7.1f} us  {e.name[:90]}"
        for e in kernels[ends[mid] + 1 : ends[mid + 1] + 1]
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layouts", default="0.5b,1.5b,7b")
    p.add_argument("--cases", default="decode,prefill,long,batch")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-parity", action="store_true")
    p.add_argument("--profile", default="", help="layouts whose eager decode step is profiled, e.g. 0.5b,7b")
    p.add_argument("--profile-prefill", type=int, default=0, help="profile a prefill of this many tokens")
    p.add_argument("--profile-batch", type=int, default=1, help="profile decode steps of this many sequences")
    p.add_argument("--folder", type=Path, default=Path("/tmp/strata-synth"))
    p.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = p.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    checks: list[dict[str, object]] = [{"layout": "-", "check": "parity ran", "equal": False}]
    try:
        checks = [] if args.skip_parity else parity(args.folder)
    except Exception:  # still time the cases: the failure is reported and the exit status is 1
        traceback.print_exc()
    for short in filter(None, args.profile.split(",")):
        try:
            profile_kernels(args.folder, short, args.out, args.profile_prefill, args.profile_batch)
        except Exception:
            traceback.print_exc()
    rows = speed(args.folder, args.layouts.split(","), args.cases.split(","), args.repeats)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_engine.json").write_text(json.dumps({"parity": checks, "speed": rows}, indent=1))
    print("\n| layout | case | strata tok/s | llama.cpp | ratio |\n|---|---|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
        print(f"| {r['layout']} | {r['case']} | {r['tok_s']:,.0f} | {r['peer'] or '-'} | {ratio} |")
    failed = [c for c in checks if not c["equal"]]
    print(f"parity: {len(checks) - len(failed)}/{len(checks)} equal")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
