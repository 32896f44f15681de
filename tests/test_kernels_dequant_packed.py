"""`dequantize_packed` against strata.quant.dequantize: bit-equal after rounding to the output dtype.

Runs in Triton's interpreter without CUDA (small shapes), compiled with CUDA (plus a model shape).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402

pytest.importorskip("triton")

from strata.kernels.dequant_packed import dequantize_packed  # noqa: E402
from strata.kernels.quant_pack import pack_quant_weight  # noqa: E402
from strata.quant import dequantize  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, random_weight  # noqa: E402

T = GGMLQuantizationType
TYPES = [T.Q8_0, T.Q5_0, T.Q4_0, T.Q4_K, T.Q6_K, T.Q2_K, T.IQ4_XS, T.IQ2_XS, T.IQ2_S]


def _check(
    qtype: GGMLQuantizationType, n: int, blocks: int, dtype: torch.dtype, layout: str = "blocks", **tiles: int
) -> None:
    k = GGML_QUANT_SIZES[qtype][0] * blocks
    raw = random_weight(qtype, n, k, seed=n * 31 + blocks)
    packed = pack_quant_weight(raw.to(DEVICE), qtype, n, k, layout)
    out = torch.full((n, k), float("nan"), dtype=dtype, device=DEVICE)
    got = dequantize_packed(packed, dtype, out=out, **tiles)
    assert got is out
    want = dequantize(raw, qtype, (n, k)).to(dtype)
    assert torch.equal(got.cpu(), want), f"{qtype.name} {dtype}: values differ from dequantize"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_bit_equal_to_dequantize(qtype: GGMLQuantizationType, dtype: torch.dtype) -> None:
    # 37 rows and K of 3 blocks: partial row and column tiles (block_k 64 does not divide 96 or 768).
    _check(qtype, 37, 3, dtype, block_n=16, block_k=64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_k", [64, 512])
def test_q4_k_planar_bit_equal(dtype: torch.dtype, block_k: int) -> None:
    # The planar layout only moves bits: its whole-sub-block decoder gives the same values, bit for
    # bit; block_k 512 leaves a partial K tile (768 = 1.5 tiles).
    _check(T.Q4_K, 37, 3, dtype, "planar", block_n=16, block_k=block_k)


@pytest.mark.parametrize(
    "qtype,layout",
    [(T.Q4_K, "blocks"), (T.Q4_K, "planar"), (T.Q6_K, "blocks"), (T.Q5_0, "blocks"), (T.Q8_0, "blocks"),
     (T.IQ2_S, "blocks")],
    ids=lambda v: getattr(v, "name", v),
)  # fmt: skip
def test_rows_gather_an_embedding_lookup(qtype: GGMLQuantizationType, layout: str) -> None:
    # Repeated, unordered ids, more of them than a tile of 16 (a partial second tile).
    n, k = 41, 2 * GGML_QUANT_SIZES[qtype][0]
    raw = random_weight(qtype, n, k, seed=7)
    packed = pack_quant_weight(raw.to(DEVICE), qtype, n, k, layout)
    ids = torch.tensor([40, 0, 7, 7, 19, 3, 40, 22, 1, 5, 8, 13, 21, 34, 2, 11, 30, 6], device=DEVICE)
    table = dequantize(raw, qtype, (n, k))
    for dtype in (torch.float32, torch.bfloat16):
        got = dequantize_packed(packed, dtype, rows=ids, block_n=16, block_k=64)
        assert torch.equal(got.cpu(), table[ids.cpu()].to(dtype)), f"{qtype.name} {dtype}"
    assert dequantize_packed(packed, torch.float32, rows=ids[:0]).shape == (0, k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="model-sized weights run only on CUDA")
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q5_0], ids=lambda t: t.name)
def test_model_shape_cuda(qtype: GGMLQuantizationType) -> None:
    _check(qtype, 4864, 3584 // GGML_QUANT_SIZES[qtype][0], torch.bfloat16)


def test_errors_name_the_problem() -> None:
    packed = pack_quant_weight(random_weight(T.Q8_0, 4, 64, seed=1).to(DEVICE), T.Q8_0, 4, 64)
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        dequantize_packed(packed, torch.float64)
    with pytest.raises(ValueError, match=r"out must be a \(4, 64\)"):
        dequantize_packed(packed, torch.float32, out=torch.empty(4, 32, device=DEVICE))
    with pytest.raises(ValueError, match="rows must be a 1-D integer tensor"):
        dequantize_packed(packed, torch.float32, rows=torch.zeros(2, 2, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match=r"out must be a \(3, 64\)"):
        rows = torch.tensor([0, 1, 2], device=DEVICE)
        dequantize_packed(packed, torch.float32, rows=rows, out=torch.empty(4, 64, device=DEVICE))
    with pytest.raises(TypeError, match="PackedQuantWeight"):
        dequantize_packed(torch.empty(4), torch.float32)  # type: ignore[arg-type]
