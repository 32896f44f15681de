"""Which kernel a QuantLinear takes by row count (STRATA_MATVEC_ROWS, STRATA_DENSE_ROWS), and their checks."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

import strata.kernels.dequant_packed as dequant_packed  # noqa: E402
import strata.kernels.quant_matmul as quant_matmul  # noqa: E402
import strata.kernels.quant_matvec as quant_matvec  # noqa: E402
from strata import env  # noqa: E402
from strata.layers.linear import WIDE_ROWS, QuantLinear  # noqa: E402
from strata.layers.placement import Placement  # noqa: E402

T = GGMLQuantizationType
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the copy is dequantized by a kernel there


def test_defaults_and_errors(monkeypatch):
    monkeypatch.delenv("STRATA_MATVEC_ROWS", raising=False)
    monkeypatch.delenv("STRATA_DENSE_ROWS", raising=False)
    assert env.kernel_row_limits() == (4, 64)
    not_integer = "STRATA_MATVEC_ROWS='x' must be an integer of at least 1; unset it for 4"
    for matvec, dense, match in [("17", "64", "at most 16"), ("8", "8", "below"), ("x", "64", not_integer)]:
        monkeypatch.setenv("STRATA_MATVEC_ROWS", matvec)
        monkeypatch.setenv("STRATA_DENSE_ROWS", dense)
        with pytest.raises(ValueError, match=match):
            env.kernel_row_limits()


@pytest.mark.parametrize("n", [8, WIDE_ROWS], ids=["narrow", "wide"])
@pytest.mark.parametrize("limits", [(16, 64), (4, 32)])
def test_rows_pick_the_kernel(monkeypatch, limits: tuple[int, int], n: int):
    monkeypatch.setenv("STRATA_MATVEC_ROWS", str(limits[0]))
    monkeypatch.setenv("STRATA_DENSE_ROWS", str(limits[1]))
    called = record_kernels(monkeypatch, n)
    raw = torch.zeros(n, 34, dtype=torch.uint8)  # Q8_0: n rows of one 34-byte block
    layer = QuantLinear(raw, T.Q8_0, (n, 32), Placement(kernels=True))
    matvec, dense = limits
    # A wide weight keeps the fused matmul at DENSE_ROWS rows too.
    last_matmul = dense if n >= WIDE_ROWS else dense - 1
    expected = {1: "matvec", matvec: "matvec", matvec + 1: "matmul", last_matmul: "matmul"}
    expected[last_matmul + 1] = "dense"
    for rows, kernel in expected.items():
        called.clear()
        layer(torch.zeros(rows, 32))
        assert called[0] == kernel, (rows, called)


def record_kernels(monkeypatch, n: int) -> list[str]:
    """The fused matvec and matmul and per-call dequantization replaced by stubs for a weight of n outputs
    and 32 inputs, each appending its name ("matvec", "matmul", "dense") to the list returned."""
    called: list[str] = []

    def record(name):
        def run(x, *args, **kwargs):  # x (rows, 32) for the fused kernels; (packed, dtype) for dense
            called.append(name)
            if name == "dense":
                return torch.zeros(n, 32, dtype=args[0], device=x.device)
            return torch.zeros(x.shape[0], n, device=x.device)

        return run

    monkeypatch.setattr(quant_matvec, "quant_matvec", record("matvec"))
    monkeypatch.setattr(quant_matmul, "quant_matmul", record("matmul"))
    monkeypatch.setattr(dequant_packed, "dequantize_packed", record("dense"))
    return called


def test_copy_rows_default_and_error(monkeypatch):
    monkeypatch.delenv("STRATA_COPY_ROWS", raising=False)
    assert env.copy_rows(4) == 5
    monkeypatch.setenv("STRATA_COPY_ROWS", "4")
    with pytest.raises(ValueError, match="STRATA_COPY_ROWS=4 must be above STRATA_MATVEC_ROWS=4"):
        env.copy_rows(4)


@pytest.mark.parametrize("n", [8, WIDE_ROWS], ids=["narrow", "wide"])
def test_a_copy_takes_batches_from_copy_rows(monkeypatch, n: int):
    # With a dense copy: the matvec up to 4 rows, cuBLAS on the copy from 5 (STRATA_COPY_ROWS' default)
    # up to and past 64 rows; the fused matmul only below COPY_ROWS when it is set higher.
    monkeypatch.setenv("STRATA_DENSE_COPY", "1")
    monkeypatch.setenv("STRATA_DENSE_WIDE", "1")
    monkeypatch.delenv("STRATA_COPY_ROWS", raising=False)
    raw = torch.zeros(n, 34, dtype=torch.uint8, device=DEVICE)
    layer = QuantLinear(raw, T.Q8_0, (n, 32), Placement(device=torch.device(DEVICE), kernels=True))
    assert layer.dense is not None
    called = record_kernels(monkeypatch, n)
    copy = layer.dense
    linear = torch.nn.functional.linear

    def read(x, weight, bias=None):
        called.append("copy" if weight is copy else "other")
        return linear(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", read)
    for rows, kernel in {4: "matvec", 5: "copy", 64: "copy", 65: "copy"}.items():
        called.clear()
        layer(torch.zeros(rows, 32, dtype=layer.dense.dtype, device=DEVICE))
        assert called == [kernel], (rows, called)
    # x of another dtype than the copy's: the paths of a weight without one.
    other = torch.float16 if layer.dense.dtype != torch.float16 else torch.float32
    for rows, kernel in {5: "matmul", 63: "matmul", 65: "dense"}.items():
        called.clear()
        layer(torch.zeros(rows, 32, dtype=other, device=DEVICE))
        assert called[0] == kernel, (rows, called)
    monkeypatch.setenv("STRATA_COPY_ROWS", "9")
    layer = QuantLinear(raw, T.Q8_0, (n, 32), Placement(device=torch.device(DEVICE), kernels=True))
    copy = layer.dense
    for rows, kernel in {8: "matmul", 9: "copy"}.items():
        called.clear()
        layer(torch.zeros(rows, 32, dtype=layer.dense.dtype, device=DEVICE))
        assert called == [kernel], (rows, called)
