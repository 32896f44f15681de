"""STRATA_DENSE_COPY: batches of COPY_ROWS rows or more multiply a weight dequantized once at build
time: the values per-call dequantization gives, so from DENSE_ROWS on the same outputs bit for bit
(below it, where the fused matmul ran, cuBLAS's rounding)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

import strata.kernels.dequant_packed as dequant_packed  # noqa: E402
import strata.layers.linear as linear_module  # noqa: E402
from strata import env  # noqa: E402
from strata.layers.linear import (  # noqa: E402
    WIDE_ROWS,
    Projections,
    QuantLinear,
    dense_copy_bytes,
    dense_copy_fits,
    stack_rows,
)
from strata.layers.placement import Placement  # noqa: E402
from tests.test_kernels_quant_matvec import random_weight  # noqa: E402

T = GGMLQuantizationType
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("qtype,k", [(T.Q8_0, 64), (T.Q4_K, 256)], ids=["Q8_0", "Q4_K"])
def test_batches_read_the_copy_with_the_same_results(monkeypatch, qtype: GGMLQuantizationType, k: int):
    n = 40
    raw = random_weight(qtype, n, k, seed=k).to(DEVICE)
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    bias = torch.randn(n)
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(DEVICE)
    monkeypatch.setenv("STRATA_DENSE_COPY", "0")
    plain = QuantLinear(raw, qtype, (n, k), place, bias)
    assert plain.dense is None
    expected = plain(x)
    # From 5 rows (STRATA_COPY_ROWS' default) the copy: the values dequantize_packed gives per call.
    five = torch.nn.functional.linear(
        x[:5], dequant_packed.dequantize_packed(plain.packed, x.dtype), plain.bias
    )
    monkeypatch.setenv("STRATA_DENSE_COPY", "1")
    layer = QuantLinear(raw, qtype, (n, k), place, bias)
    assert layer.dense is not None and layer.dense.dtype == torch.bfloat16

    def never(*args, **kwargs):
        raise AssertionError("dequantized per call")

    monkeypatch.setattr(dequant_packed, "dequantize_packed", never)
    assert layer.copy_rows == 5
    assert torch.equal(layer(x), expected)
    assert torch.equal(layer(x[:5]), five)


def test_wide_weights_keep_no_copy_where_set_off(monkeypatch):
    # STRATA_DENSE_WIDE=0: gate+up and the output head keep the fused matmul at 64 rows.
    monkeypatch.setenv("STRATA_DENSE_COPY", "1")
    monkeypatch.setenv("STRATA_DENSE_WIDE", "0")
    layer = wide_layer(T.Q4_K)
    assert layer.dense is None
    assert layer.dense_rows == 65  # the fused matmul at 64 rows


def wide_layer(qtype: GGMLQuantizationType) -> QuantLinear:
    n, k = WIDE_ROWS, 256
    raw = random_weight(qtype, n, k, seed=3).to(DEVICE)
    return QuantLinear(raw, qtype, (n, k), Placement(torch.bfloat16, torch.device(DEVICE), kernels=True))


@pytest.mark.parametrize("setting", ["auto", "1"])
def test_wide_k_quant_weights_copy(monkeypatch, setting: str):
    # A wide K-quant weight keeps a copy under auto and 1, and 64 rows read it with cuBLAS.
    monkeypatch.setenv("STRATA_DENSE_COPY", "1")
    monkeypatch.setenv("STRATA_DENSE_WIDE", setting)
    layer = wide_layer(T.Q4_K)
    assert layer.dense is not None and layer.dense.shape == (WIDE_ROWS, 256)
    assert layer.dense_rows == 64
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).to(DEVICE)
    expected = torch.nn.functional.linear(x, dequant_packed.dequantize_packed(layer.packed, torch.bfloat16))
    assert torch.equal(layer(x), expected)


def test_wide_cheap_types_copy_only_when_asked(monkeypatch):
    # Q8_0's fused matmul runs near its bytes' speed: auto keeps its wide weights (the 0.5B's head) fused.
    monkeypatch.setenv("STRATA_DENSE_COPY", "1")
    monkeypatch.setenv("STRATA_DENSE_WIDE", "auto")
    assert wide_layer(T.Q8_0).dense is None
    monkeypatch.setenv("STRATA_DENSE_WIDE", "1")
    assert wide_layer(T.Q8_0).dense is not None


@pytest.mark.parametrize(
    "qtype,k,sizes",
    [(T.Q8_0, 64, (48, 16)), (T.Q4_K, 256, (WIDE_ROWS // 2, WIDE_ROWS // 2))],
    ids=["qkv", "wide"],
)
def test_stacked_layers_stack_their_copies(
    monkeypatch, qtype: GGMLQuantizationType, k: int, sizes: tuple[int, ...]
):
    # q, k and v of one type become one layer; its copy is theirs stacked, not a second dequantization.
    # So do gate and up, whose stack is wide (the 7B's: two of 18,944 rows).
    monkeypatch.setenv("STRATA_DENSE_COPY", "1")
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    layers = [QuantLinear(random_weight(qtype, n, k, seed=n).to(DEVICE), qtype, (n, k), place) for n in sizes]
    fresh = dequant_packed.dequantize_packed

    def never(*args, **kwargs):
        raise AssertionError("dequantized again")

    monkeypatch.setattr(dequant_packed, "dequantize_packed", never)
    stacked = stack_rows(layers, place)
    assert stacked.dense is not None and stacked.packed is not None
    assert torch.equal(stacked.dense, fresh(stacked.packed, torch.bfloat16))


def test_auto_keeps_a_copy_where_half_the_gpu_stays_free():
    gib = 1 << 30
    assert dense_copy_fits(gib, free=60 * gib, total=80 * gib)  # a 7B's copies on an 80 GB GPU
    assert dense_copy_fits(2 * gib, free=10 * gib, total=16 * gib)  # 8 GB stay free: exactly half
    assert not dense_copy_fits(2 * gib + 1, free=10 * gib, total=16 * gib)


def test_auto_keeps_none_off_the_gpu(monkeypatch):
    # The copies speed up cuBLAS batches on a GPU; the CPU's kernel path (the interpreter) keeps none.
    monkeypatch.delenv("STRATA_DENSE_COPY", raising=False)
    assert env.dense_copy() == "auto"
    raw = random_weight(T.Q8_0, 40, 64, seed=5)
    layer = QuantLinear(raw, T.Q8_0, (40, 64), Placement(torch.bfloat16, torch.device("cpu"), kernels=True))
    assert layer.dense is None
    monkeypatch.setenv("STRATA_DENSE_COPY", "always")
    with pytest.raises(ValueError, match="'always' must be auto, 0 or 1; unset it for auto"):
        env.dense_copy()


def test_dense_stack_runs_the_parts_as_one_matmul(monkeypatch):
    # STRATA_DENSE_STACK: q+k (Q8_0, stacked by type) and v (Q4_K) keep one copy side by side; 64 rows
    # run one matmul over it, with the parts' biases, and each part's copy is a view of it (no memory).
    monkeypatch.setenv("STRATA_DENSE_COPY", "1")
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    k = 256
    types = {"q": (T.Q8_0, 48, True), "k": (T.Q8_0, 16, True), "v": (T.Q4_K, 32, False)}
    layers = {
        name: QuantLinear(
            random_weight(t, n, k, seed=n).to(DEVICE), t, (n, k), place, torch.randn(n) if b else None
        )
        for name, (t, n, b) in types.items()
    }
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16).to(DEVICE)
    monkeypatch.setenv("STRATA_DENSE_STACK", "0")
    apart = Projections(layers, place)
    expected = apart(x)
    monkeypatch.setenv("STRATA_DENSE_STACK", "1")
    stacked = Projections(layers, place)
    assert stacked.stacked is not None
    copy, bias, rows = stacked.stacked
    assert copy.shape == (96, k) and bias is not None and bias.shape == (96,) and rows == 5
    storage = copy.untyped_storage().data_ptr()
    assert all(
        p.dense is not None and p.dense.untyped_storage().data_ptr() == storage
        for p in stacked.parts.values()
    )
    assert dense_copy_bytes(stacked) == copy.numel() * 2  # bf16, the parts' views counted once
    calls: list[int] = []
    real = linear_module.F.linear
    monkeypatch.setattr(linear_module.F, "linear", lambda *a: calls.append(1) or real(*a))
    got = stacked(x)
    assert len(calls) == 1
    assert [g.shape for g in got] == [e.shape for e in expected]
    want = torch.nn.functional.linear(x, copy, bias).split([48, 16, 32], dim=-1)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    for g, e in zip(got, expected, strict=True):  # the same values; a matmul over more rows may round apart
        torch.testing.assert_close(g.float(), e.float(), rtol=1e-2, atol=1e-2)
    calls.clear()
    one = stacked(x[:1])  # one row: the fused matvecs, as before
    assert not calls and all(torch.equal(a, b) for a, b in zip(one, apart(x[:1]), strict=True))
