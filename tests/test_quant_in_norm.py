"""x's int8 quantization inside the RMSNorm that makes x (STRATA_QUANT_IN_NORM): the same bits as the
norm followed by `quantize_x`, and the quantization launches left out where the int8 matvecs run."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

import strata.kernels.int8_inputs as int8_inputs  # noqa: E402
from strata.kernels.rms_norm import rms_norm  # noqa: E402
from strata.kernels.rms_norm_int8 import rms_norm_int8  # noqa: E402

T = GGMLQuantizationType
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def inputs(rows: int, hidden: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, hidden, generator=g) * 3).to(dtype).to(DEVICE)
    residual = torch.randn(rows, hidden, generator=g).to(dtype).to(DEVICE)
    weight = (torch.rand(hidden, generator=g) + 0.5).to(DEVICE)
    return x, residual, weight


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rows,hidden", [(1, 896), (3, 256), (2, 3584), (1, 32), (1, 1056)])
@pytest.mark.parametrize("orders", [(True,), (False,), (False, True)], ids=["planar", "element", "both"])
def test_bit_equal_to_norm_then_quantization(dtype, rows, hidden, orders):
    x, residual, weight = inputs(rows, hidden, dtype, seed=rows * hidden)
    expected_residual, before = residual.clone(), residual.clone()
    expected = rms_norm(x, weight, 1e-6, residual=expected_residual)
    out, summed, int8 = rms_norm_int8(x, weight, 1e-6, orders, residual=residual)
    assert torch.equal(out, expected) and torch.equal(summed, expected_residual)
    assert torch.equal(residual, before)  # out of place
    assert sorted(int8) == sorted(orders)
    for planar in orders:
        want = int8_inputs.quantize_x(expected, planar=planar)
        assert all(torch.equal(a, b) for a, b in zip(int8[planar], want, strict=True)), planar


def test_without_residual_and_errors():
    x, _, weight = inputs(2, 256, torch.bfloat16, seed=7)
    out, summed, int8 = rms_norm_int8(x, weight, 1e-5, (True,))
    assert summed is None and torch.equal(out, rms_norm(x, weight, 1e-5))
    assert all(torch.equal(a, b) for a, b in zip(int8[True], int8_inputs.quantize_x(out), strict=True))
    with pytest.raises(ValueError, match=r"16-bit \(rows, H\) x with H a multiple of 32"):
        rms_norm_int8(x.float(), weight, 1e-5, (True,))
    with pytest.raises(ValueError, match="multiple of 32"):
        rms_norm_int8(x[:, :100], weight[:100], 1e-5, (True,))


def test_attached_quantization_is_voided_by_a_change():
    x = torch.randn(1, 64)
    found = {True: (torch.zeros(1), torch.zeros(1), torch.zeros(1))}
    assert int8_inputs.attached_int8(int8_inputs.attach_int8(x, found)) is found
    assert int8_inputs.attached_int8(x.view(1, 64)) is None  # another tensor object
    x.add_(1)
    assert int8_inputs.attached_int8(x) is None
    with torch.inference_mode():  # no version counter: held by the tensor object alone
        y = int8_inputs.attach_int8(torch.randn(1, 64), found)
        assert int8_inputs.attached_int8(y) is found and int8_inputs.attached_int8(y[:, :32]) is None


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q6_K], ids=lambda t: t.name)
def test_output_norm_quantizes_for_the_head(monkeypatch, qtype):
    # The model's final norm quantizes for its output head (one layer, not projections): the head's
    # matvec finds the norm's int8 copy and launches no quantization; the same logits as the norm's
    # output quantized by the head itself.
    import strata.kernels.quant_matvec as quant_matvec
    from strata.layers.linear import QuantLinear
    from strata.layers.norm import RMSNorm
    from strata.layers.placement import Placement
    from tests.test_kernels_quant_matvec import random_weight

    hidden, vocab = 256, 48
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    head = QuantLinear(random_weight(qtype, vocab, hidden, seed=5), qtype, (vocab, hidden), place)
    assert head.int8_orders() == (False,)  # element order: Q8_0's and Q6_K's int8 kernels
    x, residual, weight = inputs(1, hidden, torch.bfloat16, seed=6)
    norm = RMSNorm(weight.cpu(), 1e-6, fused=True).to(DEVICE)
    expected = head(norm.add_and_norm(x, residual.clone())[0])  # the norm, then the head's quantize_x
    norm.quantize_for(head)
    quantized: list[bool] = []
    real = quant_matvec.quantize_x
    monkeypatch.setattr(quant_matvec, "quantize_x", lambda *a, **kw: quantized.append(True) or real(*a, **kw))
    h, _ = norm.add_and_norm(x, residual.clone())
    assert torch.equal(head(h), expected) and not quantized
    head(h.clone())  # a copy carries no int8: the head quantizes it itself
    assert quantized == [True]
