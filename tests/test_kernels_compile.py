"""The kernels compile for sm_90 on any machine (`strata.kernels.compile_check`), not only run in the
interpreter: the interpreter accepted programs that Triton's compiler rejected on the H200. They compile
with the venv's Triton and with the GPU machine's (3.6, which `make test` installs beside the venv):
a str default of a jit function's constexpr compiled under 3.9 here and failed every decode attention
there."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

# Triton fixes whether it interprets when first imported: set here too (see test_kernels_quant_matvec),
# or the interpreted kernel tests that run after this module in one process would call compiled
# jit functions. The compile check itself runs in a process without it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")


DEVICE_TRITON = pathlib.Path(sys.prefix) / "triton-3.6"  # the Makefile's DEVICE_TRITON


@pytest.mark.parametrize("triton_at", ["venv", "device"])
def test_kernels_compile_for_sm90(tmp_path, triton_at):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled afresh, not found in a cache
    if triton_at == "device":
        assert (DEVICE_TRITON / "triton").is_dir(), f"no Triton 3.6 at {DEVICE_TRITON}: run `make test`"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(DEVICE_TRITON), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "strata.kernels.compile_check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert lines[0] == f"triton {'3.6.0' if triton_at == 'device' else triton.__version__}", lines[0]
    assert len([x for x in lines if x.startswith("ok ")]) >= 20 and not any("FAILED" in x for x in lines)


def test_sass_after_wait_reads_the_wait(tmp_path):
    # benchmarks/sass_after_wait.py: a preloaded matvec has work before its wait, a plain one none.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "sass_after_wait.py")
    done = subprocess.run(
        [sys.executable, script, "--match", "q5_0_matvec_kernel M=1 split=1 pdl p"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in done.stdout.splitlines()[2:]}
    before = {name: int(cells[0]) for name, cells in rows.items()}
    assert before["q5_0_matvec_kernel M=1 split=1 pdl prefetch"] < 100  # prefetch requests only
    assert before["q5_0_matvec_kernel M=1 split=1 pdl preload"] > 300  # the loads and decode
    barriers = {name: int(cells[3]) for name, cells in rows.items()}
    assert (
        barriers["q5_0_matvec_kernel M=1 split=1 pdl preload matched"]
        < barriers["q5_0_matvec_kernel M=1 split=1 pdl preload"]
    )


def test_no_jit_function_has_a_str_default():
    # The GPU machine's Triton 3.6 cannot compile a jit function whose parameter defaults to a str
    # ("'str' object has no attribute 'type'"; 3.9 can), which broke every decode attention there.
    # The compile check above meets only the variants it lists; this reads every kernel module.
    import ast

    kernels = pathlib.Path(__file__).resolve().parent.parent / "strata" / "kernels"
    found = []
    for path in sorted(kernels.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            if not any("jit" in ast.unparse(d) for d in node.decorator_list):
                continue
            args = node.args.args[len(node.args.args) - len(node.args.defaults) :]
            for arg, default in zip(args, node.args.defaults, strict=True):
                if isinstance(default, ast.Constant) and isinstance(default.value, str):
                    found.append(f"{path.name}: {node.name}({arg.arg}={default.value!r})")
    assert len(list(kernels.glob("*.py"))) > 20
    assert not found, f"pass these at every call instead of a default: {found}"
