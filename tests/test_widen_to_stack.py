"""STRATA_WIDEN_TO_STACK: Q5_0 projections rewritten as Q8_0 (the same values) to stack with Q8_0
neighbours into one launch (the 0.5B's q+k and v in half its layers)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

from strata.kernels.quant_pack import pack_quant_weight, widen_q5_0  # noqa: E402
from strata.layers.linear import Projections, QuantLinear  # noqa: E402
from strata.layers.placement import Placement  # noqa: E402
from strata.quant import dequantize  # noqa: E402
from tests.test_kernels_quant_matvec import random_weight  # noqa: E402

T = GGMLQuantizationType
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_widened_blocks_decode_to_the_same_values():
    n, k = 12, 320  # ten blocks a row
    raw = random_weight(T.Q5_0, n, k, seed=1)
    wide = widen_q5_0(pack_quant_weight(raw, T.Q5_0, n, k))
    assert wide.qtype == T.Q8_0 and (wide.n, wide.k) == (n, k)
    qs, d = wide.planes
    # The Q8_0 blocks as GGUF stores them (d, then 32 int8), decoded by the reference dequantizer.
    blocks = torch.cat(
        [d.reshape(n, -1, 1).view(torch.uint8).reshape(n, -1, 2), qs.reshape(n, -1, 32)], dim=-1
    )
    widened = dequantize(blocks.reshape(-1), T.Q8_0, (n, k))
    assert torch.equal(widened, dequantize(raw, T.Q5_0, (n, k)))
    with pytest.raises(ValueError, match="widen_q5_0 takes a Q5_0 weight, got Q8_0"):
        widen_q5_0(wide)


def projections(types: dict[str, T], place: Placement, k: int = 256) -> Projections:
    sizes = {"q": 64, "k": 32, "v": 32}
    layers = {}
    for i, (name, t) in enumerate(types.items()):
        bias = torch.randn(sizes[name], generator=torch.Generator().manual_seed(i))
        layers[name] = QuantLinear(
            random_weight(t, sizes[name], k, seed=10 + i), t, (sizes[name], k), place, bias
        )
    return Projections(layers, place)


@pytest.mark.parametrize("rows", [1, 3])
def test_q5_0_and_q8_0_projections_stack_into_one_launch(monkeypatch, rows):
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    types = {"q": T.Q5_0, "k": T.Q5_0, "v": T.Q8_0}
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).to(DEVICE)
    apart = projections(types, place)
    monkeypatch.setenv("STRATA_WIDEN_TO_STACK", "1")
    monkeypatch.setenv("STRATA_INT8_X", "Q4_K+Q6_K")  # both parts' fp32-x kernels, as widening meets them
    stacked = projections(types, place)
    assert [p.qtype for p in apart.parts.values()] == [T.Q5_0, T.Q8_0]
    assert [p.qtype for p in stacked.parts.values()] == [T.Q8_0]
    # The same weights and biases; the Q8_0 kernel adds a block's products in another order than the
    # Q5_0 kernel's two halves: fp32 rounding apart, then one bf16 rounding.
    for got, expected in zip(stacked(x), apart(x), strict=True):
        torch.testing.assert_close(got.float(), expected.float(), rtol=2**-7, atol=1e-2)


def test_other_types_are_left_alone(monkeypatch):
    monkeypatch.setenv("STRATA_WIDEN_TO_STACK", "1")
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    stacked = projections({"q": T.Q4_K, "k": T.Q4_K, "v": T.Q6_K}, place)
    assert [p.qtype for p in stacked.parts.values()] == [T.Q4_K, T.Q6_K]
