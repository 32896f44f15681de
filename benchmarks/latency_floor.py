"""What a dependent stage of a decode step costs at the least, on the GPU: `python
benchmarks/latency_floor.py [--stages 240] [--kib 0,512]`.

A one-sequence decode step is a chain of a few hundred small kernels, each waiting for the one before
(the 0.5B: about 250, ~3.4 us each on the H100, where its weights would stream in ~0.2 ms). This
times the chain's floor with nothing else in it, three ways, each as us per stage (median of
`--repeats` replays):

- `graph`: `--stages` kernels captured in one CUDA graph, launched ordinarily;
- `graph+pdl`: the same with programmatic dependent launch (`strata.kernels.pdl`, as a decode step);
- `barrier`: one persistent kernel of as many programs as SMs (at most; all must be resident at once,
  or it would spin forever) whose stages are separated by a grid-wide barrier (an arrival counter in
  global memory, spun on), the design of a per-layer "megakernel".

Each stage's programs read `--kib` KiB of weights between them (0: one weight a program, the handoff
alone; 512: about a small matvec of the 0.5B), and each stage reads the value the stage before it
wrote, summed per program: the run fails if any program of any stage read a stale value (a broken
wait or barrier).
The table says, per weight size, what a stage costs in each design and the barrier's ratio to PDL:
a per-layer persistent kernel is worth building only if its barrier is much cheaper than a kernel
boundary under PDL. `--device cpu` checks the kernels' sums in Triton's interpreter at a few stages
(the barrier needs every program resident at once, which the interpreter, running programs one by
one, never is: it is left out there).
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, default=240)
    p.add_argument("--kib", default="0,512", help="KiB of weights a stage reads, comma-separated")
    p.add_argument("--programs", type=int, default=0, help="programs a stage (0: as many as SMs)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--device", default="cuda")
    return p.parse_args()


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.device == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from strata.kernels.pdl import AVAILABLE, await_inputs  # noqa: E402

BLOCK = 1024  # fp16 weights a program loads per loop step


@triton.jit
def _weights(w_ptr, pid, per_program, BLOCK: tl.constexpr):
    """The sum of this program's `per_program` fp16 weights (a stand-in for a matvec's loads)."""
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, per_program, BLOCK):
        at = pid * per_program + start + tl.arange(0, BLOCK)
        acc += tl.load(w_ptr + at, mask=start + tl.arange(0, BLOCK) < per_program, other=0.0).to(tl.float32)
    return tl.sum(acc)


@triton.jit
def _link(chain_ptr, w_ptr, out_ptr, stage, pid, per_program, BLOCK: tl.constexpr, VOLATILE: tl.constexpr):
    """A stage's work in either design: read the value the stage before wrote (`VOLATILE`: past L1,
    which another program of the same kernel wrote), load this program's weights, program 0 writes the
    next value. Returns the value read."""
    value = tl.load(chain_ptr + stage, volatile=VOLATILE)
    tl.store(out_ptr + pid, _weights(w_ptr, pid, per_program, BLOCK))
    if pid == 0:
        tl.store(chain_ptr + stage + 1, value + 1)
    return value


@triton.jit
def _stage(chain_ptr, seen_ptr, w_ptr, out_ptr, stage, per_program, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """One link: wait for the previous (PDL), then its work."""
    await_inputs(PDL)
    pid = tl.program_id(0)
    value = _link(chain_ptr, w_ptr, out_ptr, stage, pid, per_program, BLOCK, False)
    tl.store(seen_ptr + pid, tl.load(seen_ptr + pid) + value)


@triton.jit
def _persistent(chain_ptr, seen_ptr, w_ptr, out_ptr, arrived_ptr, stages, per_program, BLOCK: tl.constexpr):
    """Every stage in one kernel: after each, all programs meet at a grid-wide barrier."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    seen = 0
    for stage in range(stages):
        seen += _link(chain_ptr, w_ptr, out_ptr, stage, pid, per_program, BLOCK, True)
        tl.debug_barrier()  # the program's stores are issued before it arrives
        tl.atomic_add(arrived_ptr, 1, sem="release", scope="gpu")
        target = (stage + 1) * programs
        count = tl.atomic_add(arrived_ptr, 0, sem="acquire", scope="gpu")
        while count < target:
            count = tl.atomic_add(arrived_ptr, 0, sem="acquire", scope="gpu")
    tl.store(seen_ptr + pid, tl.load(seen_ptr + pid) + seen)


@dataclass
class Buffers:
    chain: torch.Tensor  # (stages + 1,) int32: stage s writes chain[s + 1] = chain[s] + 1
    seen: torch.Tensor  # (programs,) int32: the chain values each program read, summed
    w: torch.Tensor  # the weights, fp16, per_program a program
    out: torch.Tensor  # (programs,) the weight sums (kept so the loads are not optimized away)
    arrived: torch.Tensor  # (1,) int32: the barrier's arrival counter
    per_program: int

    @classmethod
    def make(cls, stages: int, programs: int, kib: int, device: torch.device) -> Buffers:
        per_program = max(1, kib * 512 // programs)  # fp16 elements
        return cls(
            torch.zeros(stages + 1, dtype=torch.int32, device=device),
            torch.zeros(programs, dtype=torch.int32, device=device),
            torch.randn(per_program * programs, device=device).half(),
            torch.empty(programs, dtype=torch.float32, device=device),
            torch.zeros(1, dtype=torch.int32, device=device),
            per_program,
        )


def run_chain(b: Buffers, stages: int, pdl: bool) -> None:
    extra = {"launch_pdl": True} if pdl else {}
    for stage in range(stages):
        _stage[(b.seen.numel(),)](
            b.chain, b.seen, b.w, b.out, stage, b.per_program, BLOCK=BLOCK, PDL=pdl, **extra
        )  # fmt: skip


def run_persistent(b: Buffers, stages: int) -> None:
    _persistent[(b.seen.numel(),)](b.chain, b.seen, b.w, b.out, b.arrived, stages, b.per_program, BLOCK=BLOCK)


def check(b: Buffers, stages: int, runs: int) -> None:
    """After `runs` runs (each from a zeroed chain) every program saw 0 + 1 + ... + stages - 1 a run."""
    want = runs * stages * (stages - 1) // 2
    seen = b.seen.tolist()
    if any(s != want for s in seen):
        bad = [i for i, s in enumerate(seen) if s != want][:8]
        raise SystemExit(f"stale reads: programs {bad} saw {[seen[i] for i in bad]}, expected {want} each")


def timed(body: Callable[[], None], b: Buffers, stages: int, repeats: int) -> float:
    """us per stage: `body` captured in a graph (after a checked warm-up run), replayed `repeats` times."""

    def reset_and_run() -> None:
        b.chain.zero_()
        b.arrived.zero_()
        body()

    b.seen.zero_()
    reset_and_run()
    torch.cuda.synchronize()
    check(b, stages, 1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        reset_and_run()
    b.seen.zero_()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / stages)
    check(b, stages, repeats)
    return statistics.median(times)


def main() -> None:
    args = ARGS or parse_args()
    device = torch.device(args.device)
    sizes = [int(k) for k in args.kib.split(",")]
    if device.type == "cpu":
        for kib in sizes:
            b = Buffers.make(4, 3, kib, device)
            run_chain(b, 4, pdl=False)
            check(b, 4, 1)
        print(f"chain sums checked in the interpreter ({len(sizes)} sizes); time on a GPU")
        return
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if args.programs > sms:
        raise SystemExit(f"--programs {args.programs}: at most the {sms} SMs, or the barrier never opens")
    programs = args.programs or sms
    pdl = AVAILABLE and torch.cuda.get_device_capability(device)[0] >= 9
    print(f"{torch.cuda.get_device_name(device)}: {programs} programs a stage, {args.stages} stages")
    rows = []
    for kib in sizes:
        b = Buffers.make(args.stages, programs, kib, device)
        graph = timed(lambda b=b: run_chain(b, args.stages, False), b, args.stages, args.repeats)
        with_pdl = (
            timed(lambda b=b: run_chain(b, args.stages, True), b, args.stages, args.repeats) if pdl else None
        )
        barrier = timed(lambda b=b: run_persistent(b, args.stages), b, args.stages, args.repeats)
        rows.append((kib, graph, with_pdl, barrier))
    print("| KiB a stage | graph us | graph+pdl us | barrier us | pdl / barrier |")
    print("|---:|---:|---:|---:|---:|")
    for kib, graph, with_pdl, barrier in rows:
        pdl_text = f"{with_pdl:.2f}" if with_pdl is not None else "n/a"
        ratio = f"{with_pdl / barrier:.2f}" if with_pdl is not None else "n/a"
        print(f"| {kib} | {graph:.2f} | {pdl_text} | {barrier:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
