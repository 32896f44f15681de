"""The gated activation computed inside x's int8 quantization (STRATA_ACT_IN_QUANT): the same bits as
computing it first, and the activation's own launch left out where the int8 matvec runs."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

import strata.kernels.int8_inputs as int8_inputs  # noqa: E402
import strata.kernels.quant_matvec as quant_matvec  # noqa: E402
import strata.layers.linear as linear  # noqa: E402
from strata import env  # noqa: E402
from strata.layers.activation import gated  # noqa: E402
from strata.layers.linear import QuantLinear  # noqa: E402
from strata.layers.placement import Placement  # noqa: E402
from tests.test_kernels_quant_matvec import random_weight  # noqa: E402

T = GGMLQuantizationType
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ACTS = ["silu", "gelu_tanh"]
# Large negative gates overflow exp in the interpreter's numpy, as in the activation kernel's own tests.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


def gate_up(m: int, k: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gate and up as the two column halves of one (m, 2k) projection output, as the model has them."""
    both = torch.randn(m, 2 * k, generator=torch.Generator().manual_seed(seed)) * 3
    both = both.to(dtype).to(DEVICE)
    return both[:, :k], both[:, k:]


@pytest.mark.parametrize("planar", [True, False], ids=["planar order", "element order"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_quantized_in_one_launch_equals_activation_then_quantization(act, dtype, planar):
    gate, up = gate_up(3, 1312, dtype, seed=1)  # 41 sub-blocks: a partial program of 32
    fused = int8_inputs.quantize_x(gate, planar=planar, up=up, act=act)
    first = int8_inputs.quantize_x(quant_matvec.gated_act(gate, up, act), planar=planar)
    for name, a, b in zip(("xq", "xd", "xs"), fused, first, strict=True):
        assert torch.equal(a, b), f"{name} differs"


@pytest.mark.parametrize("rows", [1, 3, 6])  # 6: past the matvec's 4 rows (the matmul)
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q5_0], ids=lambda t: t.name)  # Q5_0: fp32-x matvec
@pytest.mark.parametrize("act", ACTS)
def test_layer_output_is_unchanged_and_the_launch_is_left_out(monkeypatch, act, qtype, rows):
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    monkeypatch.setenv("STRATA_INT8_X", "Q4_K+Q6_K")  # Q5_0 on 16-bit x
    n, k = 40, 512
    gate, up = gate_up(rows, k, torch.bfloat16, seed=2)
    raw = random_weight(qtype, n, k, seed=3)
    place = Placement(torch.bfloat16, torch.device(DEVICE), kernels=True)
    monkeypatch.setenv("STRATA_ACT_IN_QUANT", "0")
    expected = QuantLinear(raw, qtype, (n, k), place)(gated(act, gate, up, True))
    monkeypatch.setenv("STRATA_ACT_IN_QUANT", "1")
    layer = QuantLinear(raw, qtype, (n, k), place)
    calls: list[str] = []
    for module, name in ((linear, "gated"), (quant_matvec, "gated_act")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    assert torch.equal(layer(gate, up, act), expected)
    int8_rows = qtype != T.Q5_0 and rows <= layer.matvec_rows
    assert calls == ([] if int8_rows else ["gated_act"] if rows <= layer.matvec_rows else ["gated"])


def test_env_and_argument_errors(monkeypatch):
    monkeypatch.setenv("STRATA_ACT_IN_QUANT", "yes")
    with pytest.raises(ValueError, match="STRATA_ACT_IN_QUANT=.yes. must be 0 or 1; unset it for 1"):
        env.act_in_quant()
    gate, up = gate_up(2, 256, torch.bfloat16, seed=4)
    raw = random_weight(T.Q4_K, 8, 256, seed=5).to(DEVICE)
    with pytest.raises(ValueError, match="act must be one of silu, gelu_tanh"):
        quant_matvec.quant_matvec(gate, raw, T.Q4_K, 8, 256, up=up, act="relu")
    with pytest.raises(ValueError, match=r"up must be a \(2, 256\) torch.bfloat16 tensor"):
        quant_matvec.quant_matvec(gate, raw, T.Q4_K, 8, 256, up=up.float())


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("act", ACTS)
def test_fp32_x_kernels_take_silu_in_their_loads(monkeypatch, act, qtype, rows):
    # int8_x off (STRATA_INT8_X=none): Q4_K's planar and Q6_K's fp32-x matvecs compute silu(gate) * up
    # as they load x, the same bits as silu_mul first; gelu_tanh still launches the activation.
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    monkeypatch.setenv("STRATA_INT8_X", "none")
    n, k = 24, 768  # 3 super-blocks: a partial step of the 512-wide tiles
    gate, up = gate_up(rows, k, torch.bfloat16, seed=6)
    raw = random_weight(qtype, n, k, seed=7).to(DEVICE)
    packed = quant_matvec.pack_quant_weight(raw, qtype, n, k)
    expected = quant_matvec.quant_matvec(quant_matvec.gated_act(gate, up, act), packed, qtype, n, k)
    calls: list[str] = []
    real = quant_matvec.gated_act
    monkeypatch.setattr(quant_matvec, "gated_act", lambda *a: calls.append("gated_act") or real(*a))
    configs = [None]
    if qtype == T.Q4_K:
        configs.append(quant_matvec.MatvecConfig(block_n=8, block_k=512, split_k=2, prefetch=True))
    for config in configs:
        assert torch.equal(
            quant_matvec.quant_matvec(gate, packed, qtype, n, k, up=up, act=act, config=config), expected
        )
    assert calls == ([] if act == "silu" else ["gated_act"] * len(configs))
