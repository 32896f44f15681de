"""The sm_90 machine code (SASS) of a compiled kernel, read with Triton's bundled nvdisasm: what
`compile_check` and `benchmarks/sass_after_wait.py` count (barriers in loops, the work after the PDL
wait). Every reader returns None where nvdisasm is missing."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path


def barriers_in_loops(cubin: bytes) -> int | None:
    """Barriers (BAR.SYNC) inside the SASS's loops, from Triton's bundled nvdisasm (None without it):
    what the layout conversions that are not no-ops cost every iteration. `compile_check.converts_in_loops`
    counts the TTGIR's conversions, some of which change nothing and compile to no instruction at all."""
    lines = sass_lines(cubin)
    if lines is None:
        return None
    labels = {
        line.strip()[:-1]: i
        for i, line in enumerate(lines)
        if line.strip().startswith(".L") and line.strip().endswith(":")
    }
    inside: set[int] = set()  # lines in some loop, counted once however many loops hold them
    for i, line in enumerate(lines):  # a loop: a branch back to a label above it
        target = re.search(r"BRA `?\(?(\.L\w+)", line)
        start = labels.get(target.group(1), i) if target else i
        inside.update(range(start, i))
    return sum("BAR.SYNC" in lines[j] for j in inside)


def sass_lines(cubin: bytes) -> list[str] | None:
    """The cubin's SASS lines, from Triton's bundled nvdisasm (None without it)."""
    import triton

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    if not nvdisasm.exists():
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run(
            [str(nvdisasm), "-c", f.name], capture_output=True, text=True, check=True
        ).stdout
    return sass.splitlines()


def at_wait(cubin: bytes) -> tuple[list[str], list[str]] | None:
    """The SASS's instructions before and after its first grid dependency wait (ACQBULK; a kernel
    without one: all after), from Triton's bundled nvdisasm (None without it)."""
    lines = sass_lines(cubin)
    if lines is None:
        return None
    code = [line for line in lines if "*/" in line and ";" in line]
    wait = next((i for i, line in enumerate(code) if "ACQBULK" in line), 0)
    return code[:wait], code[wait:]


def decodes_after_wait(cubin: bytes) -> int | None:
    """The `exact_float` decodes (FADD of -(2**23 + bias)) after the first wait (`at_wait`; None
    without nvdisasm): a preloaded fp32-x matvec must have none, `await_inputs_after` keeping ptxas
    from moving them past the wait."""
    split = at_wait(cubin)
    return None if split is None else sum("FADD" in line and "-8388" in line for line in split[1])
