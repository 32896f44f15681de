"""x's int8 quantization inside the RMSNorm that makes x (STRATA_QUANT_IN_NORM): the same bits as the
norm followed by `quantize_x`, and the quantization launches left out where the int8 matvecs run."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

import strata.kernels.quant_matvec as quant_matvec  # noqa: E402
from strata import env  # noqa: E402
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
        want = quant_matvec.quantize_x(expected, planar=planar)
        assert all(torch.equal(a, b) for a, b in zip(int8[planar], want, strict=True)), planar


def test_without_residual_and_errors():
    x, _, weight = inputs(2, 256, torch.bfloat16, seed=7)
    out, summed, int8 = rms_norm_int8(x, weight, 1e-5, (True,))
    assert summed is None and torch.equal(out, rms_norm(x, weight, 1e-5))
    assert all(torch.equal(a, b) for a, b in zip(int8[True], quant_matvec.quantize_x(out), strict=True))
    with pytest.raises(ValueError, match=r"16-bit \(rows, H\) x with H a multiple of 32"):
        rms_norm_int8(x.float(), weight, 1e-5, (True,))
    with pytest.raises(ValueError, match="multiple of 32"):
        rms_norm_int8(x[:, :100], weight[:100], 1e-5, (True,))


def test_attached_quantization_is_voided_by_a_change():
    x = torch.randn(1, 64)
    found = {True: (torch.zeros(1), torch.zeros(1), torch.zeros(1))}
    assert quant_matvec.attached_int8(quant_matvec.attach_int8(x, found)) is found
    assert quant_matvec.attached_int8(x.view(1, 64)) is None  # another tensor object
    x.add_(1)
    assert quant_matvec.attached_int8(x) is None
    with torch.inference_mode():  # no version counter: held by the tensor object alone
        y = quant_matvec.attach_int8(torch.randn(1, 64), found)
        assert quant_matvec.attached_int8(y) is found and quant_matvec.attached_int8(y[:, :32]) is None


def test_env(monkeypatch):
    monkeypatch.delenv("STRATA_QUANT_IN_NORM", raising=False)
    assert env.quant_in_norm() is True
    monkeypatch.setenv("STRATA_QUANT_IN_NORM", "0")
    assert env.quant_in_norm() is False
    monkeypatch.setenv("STRATA_QUANT_IN_NORM", "yes")
    with pytest.raises(ValueError, match="STRATA_QUANT_IN_NORM='yes' must be 0 or 1; unset it for 1"):
        env.quant_in_norm()


def test_whole_model_tokens_unchanged_with_fewer_launches(monkeypatch, tmp_path):
    # bf16 on the kernel path, Q8_0 weights on int8 x (gguf writes no K-quants), llama blocks.
    from strata.gguf.synth import SynthSpec, write_synthetic
    from tests.synthetic_decode import greedy_kernel_path

    spec = SynthSpec(
        "llama", hidden_size=256, ffn_size=512, num_heads=4, num_kv_heads=2, head_dim=64, weight_type=T.Q8_0
    )
    path = write_synthetic(tmp_path / "m.gguf", spec)
    monkeypatch.setenv("STRATA_TRITON_ON_CPU", "1")
    monkeypatch.setenv("STRATA_INT8_X", "Q8_0")
    real, calls = quant_matvec.quantize_x, []
    monkeypatch.setattr(quant_matvec, "quantize_x", lambda *a, **k: calls.append(1) or real(*a, **k))

    def greedy(in_norm: str) -> list[int]:
        monkeypatch.setenv("STRATA_QUANT_IN_NORM", in_norm)
        calls.clear()
        return greedy_kernel_path(path, DEVICE)

    fused_ids, fused_calls = greedy("1"), len(calls)
    assert fused_ids == greedy("0")
    assert fused_calls < len(calls)  # the decode steps' q/k/v and gate/up inputs came quantized
