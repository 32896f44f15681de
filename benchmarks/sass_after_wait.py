"""What each kernel variant does after its PDL wait, read from its sm_90 machine code on any machine.

A decode step at one sequence is a chain of small kernels, each bound by what lies between its
grid dependency wait (`ACQBULK` in SASS) and its last store, not by bandwidth: the twenty-third
session found the 0.5B's Q5_0 matvecs moving x through shared memory between 20 barriers there,
and cut them to 3 (1.147x end to end). This lists, for `compile_check`'s variants (the kernels at
representative constexprs), the instructions, global loads, barriers and shared-memory round trips
before and after the wait, so the next target can be picked without a GPU. A count is not a time:
pair what it suggests on the GPU.

    python benchmarks/sass_after_wait.py [--match SUBSTRING ...]
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--match", nargs="*", default=[], help="only variants whose name holds one of these")
    args = p.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter's jit functions cannot be compiled", file=sys.stderr)
        return 2
    from strata.kernels.compile_check import compile_variant, variants
    from strata.kernels.sass import at_wait

    print("| variant | before wait | after wait | LDG after | BAR.SYNC after | STS+STSM after | SHFL after |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, fn, constexprs, pointers in variants():
        if args.match and not any(m in name for m in args.match):
            continue
        before, after = at_wait(compile_variant(fn, constexprs, pointers).asm["cubin"]) or ([], [])

        def count(*ops: str) -> int:
            return sum(any(op in line for op in ops) for line in after)  # noqa: B023 - used at once

        stores = count(" STS ", " STS.", "STSM")
        print(
            f"| {name} | {len(before)} | {len(after)} | {count('LDG')} | {count('BAR.SYNC')} | {stores} "
            f"| {count('SHFL')} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
