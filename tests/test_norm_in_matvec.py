"""RMSNorm inside the fp32-x matvecs' loads and the residual add inside their stores
(STRATA_NORM_IN_MATVEC): against `rms_norm` then the matvec, and the matvec then the residual add
that `rms_norm` does.

The residual add rounds as `rms_norm`'s does: the same bits (and on a GPU those of torch's
`residual + y`; Triton's interpreter rounds its casts to 16 bits toward zero). The norm's 1 / rms comes from a
sum of squares that the compiled matvec reduces in its own thread layout, so on a GPU it may differ
from the norm kernel's in the last bit (stated tolerance: the matvec's output within 2e-2 relative
of its largest value, two bf16 steps of x); in Triton's interpreter both reduce the same padded row
with numpy, so there the results are compared bit for bit as well, which catches a norm computed or
rounded in another way than `rms_norm`'s.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

import strata.kernels.int8_inputs as int8_inputs  # noqa: E402
import strata.kernels.quant_matvec as quant_matvec  # noqa: E402
from strata.kernels.quant_matvec import MatvecConfig, pack_quant_weight, takes_norm  # noqa: E402
from strata.kernels.rms_norm import rms_norm  # noqa: E402
from strata.layers.linear import Projections, QuantLinear  # noqa: E402
from strata.layers.norm import RMSNorm  # noqa: E402
from strata.layers.placement import Placement  # noqa: E402
from tests.fp32_x import fp32_x_q8_0_and_q5_0  # noqa: E402, F401 - autouse: Q8_0, Q5_0 on 16-bit x
from tests.test_kernels_quant_matvec import random_weight  # noqa: E402

T = GGMLQuantizationType
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
EPS = 1e-6


def row_and_weight(
    k: int, seed: int, dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(1, k, generator=g) * 4).to(dtype).to(DEVICE)
    w = (torch.rand(k, generator=g) + 0.5).to(DEVICE)  # the norm's weight stays fp32, as RMSNorm's
    return x, w


def assert_close_or_equal(got: torch.Tensor, expected: torch.Tensor) -> None:
    scale = expected.float().abs().max().clamp_min(1e-3)
    assert (got.float() - expected.float()).abs().max() <= 2e-2 * scale
    if INTERPRETED:
        assert torch.equal(got, expected)


# (qtype, config) cases: every fp32-x loop that takes NORMED loads; K = 1,280 is not a power of two
# (a padded norm tile) and leaves partial steps; split-K sums in the kernel.
CASES = [
    (T.Q8_0, None),
    (T.Q8_0, MatvecConfig(8, 512, 2, matched_loads=True)),
    (T.Q5_0, None),
    (T.Q5_0, MatvecConfig(8, 512, 1, flat_acc=True)),
    (T.Q5_0, MatvecConfig(8, 256, 3, matched_loads=True)),
    (T.Q4_K, None),
    (T.Q4_K, MatvecConfig(8, 512, 2, prefetch=True)),
    (T.Q6_K, MatvecConfig(16, 256, 2)),
]


@pytest.mark.parametrize(("qtype", "config"), CASES, ids=[f"{t.name}-{i}" for i, (t, _) in enumerate(CASES)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_norm_in_the_loads_equals_the_norm_first(monkeypatch, qtype, config, dtype):
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    monkeypatch.setenv("STRATA_INT8_X", "none")
    n, k = 40, 1280
    x, w = row_and_weight(k, seed=1, dtype=dtype)
    packed = pack_quant_weight(random_weight(qtype, n, k, seed=2).to(DEVICE), qtype, n, k)
    assert takes_norm(packed, x.dtype, 1)
    expected = quant_matvec.quant_matvec(rms_norm(x, w, EPS), packed, qtype, n, k, config=config)
    launched: list[str] = []
    real = quant_matvec.rms_norm
    monkeypatch.setattr(quant_matvec, "rms_norm", lambda *a: launched.append("rms_norm") or real(*a))
    got = quant_matvec.quant_matvec(x, packed, qtype, n, k, config=config, norm=(w, EPS))
    assert launched == []  # normalized in the loads
    assert_close_or_equal(got, expected)


def test_fp32_x_takes_the_norm_in_its_loads(monkeypatch):
    # fp32 x is never int8: every type that takes NORMED loads takes it, Q4_K and Q6_K included.
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    n, k = 16, 512
    x, w = row_and_weight(k, seed=17, dtype=torch.float32)
    for qtype in (T.Q5_0, T.Q4_K, T.Q6_K):
        packed = pack_quant_weight(random_weight(qtype, n, k, seed=18).to(DEVICE), qtype, n, k)
        assert takes_norm(packed, x.dtype, 1)
        expected = quant_matvec.quant_matvec(rms_norm(x, w, EPS), packed, qtype, n, k)
        assert_close_or_equal(quant_matvec.quant_matvec(x, packed, qtype, n, k, norm=(w, EPS)), expected)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_where_the_loads_cannot_the_norm_launches_first(monkeypatch, qtype):
    # Int8 x (Q4_K and Q6_K here) and two rows of x: the norm's own launch, the same bits.
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    n, k = 24, 512
    packed = pack_quant_weight(random_weight(qtype, n, k, seed=3).to(DEVICE), qtype, n, k)
    x, w = row_and_weight(k, seed=4)
    two = torch.cat([x, x.flip(1)])
    for rows in (x, two):
        takes = takes_norm(packed, rows.dtype, rows.shape[0])
        assert takes == (qtype == T.Q8_0 and rows.shape[0] == 1)
        if takes:
            continue
        expected = quant_matvec.quant_matvec(rms_norm(rows, w, EPS), packed, qtype, n, k)
        assert torch.equal(quant_matvec.quant_matvec(rows, packed, qtype, n, k, norm=(w, EPS)), expected)


# The residual add in the store: fp32-x and int8-x kernels, split-K or not, one row and three.
ADD_CASES = [
    (T.Q8_0, 1, None),
    (T.Q5_0, 3, MatvecConfig(8, 256, 2)),
    (T.Q4_K, 1, None),  # int8 x, the 8 x 2,048 tile's family
    (T.Q4_K, 3, MatvecConfig(8, 256, 2)),
    (T.Q6_K, 1, MatvecConfig(16, 256, 2)),
    (T.Q4_0, 2, None),
    (T.IQ4_XS, 1, None),
]


@pytest.mark.parametrize(
    ("qtype", "rows", "config"), ADD_CASES, ids=[f"{t.name}-{m}" for t, m, _ in ADD_CASES]
)
def test_residual_add_in_the_store_is_torchs_add(monkeypatch, qtype, rows, config):
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    monkeypatch.setenv("STRATA_Q6K_LAYOUT", "blocks")  # the rows kernel's add: test_kernels_q6k_rows.py
    n, k = 48, 512
    packed = pack_quant_weight(random_weight(qtype, n, k, seed=5).to(DEVICE), qtype, n, k)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(rows, k, generator=g).to(torch.bfloat16).to(DEVICE)
    residual = (torch.randn(rows, n, generator=g) * 8).to(torch.bfloat16).to(DEVICE)
    y = quant_matvec.quant_matvec(x, packed, qtype, n, k, config=config)
    expected = residual.clone()
    rms_norm(y, torch.ones(n, device=DEVICE), EPS, residual=expected)  # expected += y
    out = residual.clone()
    got = quant_matvec.quant_matvec(x, packed, qtype, n, k, config=config, out=out, accumulate=True)
    assert got is out
    assert torch.equal(out, expected)
    if not INTERPRETED:
        assert torch.equal(out, residual + y)


def test_argument_errors():
    n, k = 8, 256
    packed = pack_quant_weight(random_weight(T.Q8_0, n, k, seed=7).to(DEVICE), T.Q8_0, n, k)
    x, w = row_and_weight(k, seed=8)
    with pytest.raises(ValueError, match="accumulate=True adds y to out: pass out"):
        quant_matvec.quant_matvec(x, packed, T.Q8_0, n, k, accumulate=True)
    with pytest.raises(ValueError, match=r"norm's weight must be a contiguous \(256,\) tensor"):
        quant_matvec.quant_matvec(x, packed, T.Q8_0, n, k, norm=(w[:128], EPS))
    with pytest.raises(ValueError, match="norm and up cannot go together"):
        quant_matvec.quant_matvec(x, packed, T.Q8_0, n, k, norm=(w, EPS), up=x)


@pytest.mark.parametrize("second", [T.Q5_0, T.Q4_K], ids=lambda t: t.name)
def test_projections_normalize_in_their_loads_only_where_every_part_can(monkeypatch, second):
    # q+k of Q8_0 and v of another type, two launches: with a Q5_0 v both take the norm in their loads
    # (no norm launch); with Q4_K on int8 x (the default) the norm launches once, for both parts.
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    k = 512
    shapes = {"q": (T.Q8_0, 64), "k": (T.Q8_0, 32), "v": (second, 32)}
    layers = {
        name: QuantLinear(random_weight(t, n, k, seed=10 + i), t, (n, k), place)
        for i, (name, (t, n)) in enumerate(shapes.items())
    }
    projections = Projections(layers, place)
    x, w = row_and_weight(k, seed=11)
    norm = RMSNorm(w, EPS, fused=True)
    expected = projections(rms_norm(x, w, EPS))
    launched: list[str] = []
    for module in (quant_matvec, rms_norm_module()):
        real = module.rms_norm
        monkeypatch.setattr(
            module, "rms_norm", lambda *a, _real=real, **kw: launched.append("norm") or _real(*a, **kw)
        )
    got = projections(x, norm)
    assert launched == ([] if second == T.Q5_0 else ["norm"])
    for a, b in zip(got, expected, strict=True):
        assert_close_or_equal(a, b)


def test_layer_adds_its_output_to_a_residual(monkeypatch):
    # In the matvec's store at one row (as the norm kernel's residual add), by torch after the matmul at
    # eight (past STRATA_MATVEC_ROWS): on a GPU the same rounding.
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    n, k = 48, 256
    layer = QuantLinear(random_weight(T.Q8_0, n, k, seed=12), T.Q8_0, (n, k), place)
    g = torch.Generator().manual_seed(13)
    for rows in (1, 8):
        x = torch.randn(rows, k, generator=g).to(torch.bfloat16).to(DEVICE)
        residual = (torch.randn(rows, n, generator=g) * 8).to(torch.bfloat16).to(DEVICE)
        expected = residual + layer(x)
        if rows == 1:
            expected = residual.clone()
            rms_norm(layer(x), torch.ones(n, device=DEVICE), EPS, residual=expected)
        out = residual.clone()
        assert layer(x, add_to=out) is out
        assert torch.equal(out, expected)


def rms_norm_module():
    import strata.kernels.rms_norm as module

    return module


def test_row_parallel_layers_and_int8_copies_take_the_norm_first(monkeypatch):
    # A row-parallel layer (all_reduce: its x is a rank's part of the row, whose norm the loads cannot
    # take) normalizes first; so does an int8 matvec handed x's int8 copy, which is dropped (it was
    # made from x, not from the norm).
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    n, k = 24, 512
    x, w = row_and_weight(k, seed=14)
    normed = rms_norm(x, w, EPS)
    layer = QuantLinear(random_weight(T.Q8_0, n, k, seed=15), T.Q8_0, (n, k), place, all_reduce=True)
    assert not layer.takes_norm(x)
    assert torch.equal(layer(x, norm=RMSNorm(w, EPS, fused=True)), layer(normed))
    packed = pack_quant_weight(random_weight(T.Q4_K, n, k, seed=16).to(DEVICE), T.Q4_K, n, k)
    stale = {True: int8_inputs.quantize_x(x, planar=True)}
    got = quant_matvec.quant_matvec(x, packed, T.Q4_K, n, k, x_int8=stale, norm=(w, EPS))
    assert torch.equal(got, quant_matvec.quant_matvec(normed, packed, T.Q4_K, n, k))
