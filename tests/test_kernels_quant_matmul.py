"""The fused dequant + matmul kernel against strata.quant.dequantize then a float64 matmul.

Without CUDA the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set here before triton is
imported) at small sizes with small tiles, so that every edge (partial M, N and K tiles, grouped
order) is crossed; with CUDA it runs compiled, at the same sizes plus model-sized ones.

The reference rounds the dequantized weights to x's dtype, as the kernel does before its dot (for
fp32 x nothing is rounded), then multiplies in float64. What remains is rounding y to its dtype and
fp32 accumulation in another order: |y - ref| <= eps(dtype) * |ref| + 1e-5 * (|x| @ |W|^T). The
second term is the matvec tests' bound for fp32 sums (typical error about sqrt(K) * 2^-24 of the
absolute sum, under 2e-6 at K <= 512); a wrong scale, nibble or group gives errors of the order of
|ref| itself. Bit-exactness of the decoded weights is tested separately with x = I.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402

pytest.importorskip("triton")

from strata.kernels.quant_matmul import MatmulConfig, default_config, quant_matmul  # noqa: E402
from strata.kernels.quant_matvec import MatvecConfig, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import PackedQuantWeight, pack_quant_weight  # noqa: E402
from strata.quant import dequantize  # noqa: E402
from tests.test_kernels_quant_matvec import TYPES, codebook_weight, random_weight  # noqa: E402

T = GGMLQuantizationType
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
cuda_only = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="model-sized shapes need CUDA (too slow for the interpreter)"
)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def k_for(qtype: GGMLQuantizationType) -> int:
    """Three quant blocks of K: 96 for the 32-element types (no multiple of block_k = 64), 768 else."""
    return 3 * GGML_QUANT_SIZES[qtype][0]


def check(
    qtype: GGMLQuantizationType,
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    config: MatmulConfig | None,
    x_stride: int | None = None,
) -> None:
    raw = random_weight(qtype, n, k, seed=hash((qtype, m, n, k)) % 2**32)
    w = dequantize(raw, qtype, (n, k)).to(dtype).double()
    x_full = torch.randn(m, x_stride or k, dtype=torch.float64).to(dtype)
    x = x_full[:, :k]  # with x_stride: rows further apart than k
    ref = x.double() @ w.T
    bound = x.double().abs() @ w.abs().T
    packed = pack_quant_weight(raw.to(DEVICE), qtype, n, k)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
    y = quant_matmul(x_full.to(DEVICE)[:, :k], packed, out=out, config=config)
    assert y is out
    y = y.cpu().double()
    assert torch.isfinite(y).all(), f"{qtype.name}: non-finite outputs remain (poisoned with NaN)"
    err = (y - ref).abs()
    tol = torch.finfo(dtype).eps * ref.abs() + 1e-5 * bound
    worst = (err / tol).max().item()
    assert (err <= tol).all(), f"{qtype.name} m={m} n={n} k={k} {dtype} {config}: error/tol up to {worst:.2f}"


# Per M: a config whose tiles leave partial M and N tiles (n = 72 with block_n = 32) and, for the
# 32-element types, a partial K tile (k = 96 with block_k = 64); group_m = 2 makes a partial group
# of row tiles at M = 40 (3 tiles of 16). M = 17 computes y^T; M = 1 takes the default config.
CONFIGS = {
    1: None,
    17: MatmulConfig(block_m=16, block_n=32, block_k=64, group_m=1, swap_ab=True),
    40: MatmulConfig(block_m=16, block_n=32, block_k=64, group_m=2),
}


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_reference(qtype: GGMLQuantizationType, m: int, dtype: torch.dtype):
    check(qtype, m, 72, k_for(qtype), dtype, CONFIGS[m])


@pytest.mark.parametrize("m", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_q4_k_planar_matches_reference(monkeypatch, m: int, dtype: torch.dtype):
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    check(T.Q4_K, m, 72, k_for(T.Q4_K), dtype, CONFIGS[m])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_strided_x_and_one_tile(qtype: GGMLQuantizationType):
    # x rows 48 elements further apart than k; one program covers all of M and N (100 < 128). Two
    # stages: IQ4_XS's 128 x 256 W tiles in three asked for 237,568 bytes of shared memory on an H100,
    # over its 232,448 (compiled there, 2026-12-06).
    config = MatmulConfig(16, 128, 256, num_stages=2)
    check(qtype, 5, 100, k_for(qtype), torch.float16, config, x_stride=k_for(qtype) + 48)


@pytest.mark.parametrize("qtype", [*TYPES, "Q4_K planar"], ids=lambda t: getattr(t, "name", t))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decoded_weights_are_exact(qtype, dtype: torch.dtype):
    # x = I gives y = W^T: one product per output, so y must equal dequantize's values rounded to
    # x's dtype bit for bit (any other rounding of d * q - dmin * mn shows here).
    layout = "planar" if qtype == "Q4_K planar" else "blocks"
    qtype = T.Q4_K if layout == "planar" else qtype
    n, k = 24, GGML_QUANT_SIZES[qtype][0] * (2 if GGML_QUANT_SIZES[qtype][0] == 256 else 4)
    raw = random_weight(qtype, n, k, seed=3)
    expected = dequantize(raw, qtype, (n, k)).to(dtype).T
    packed = pack_quant_weight(raw.to(DEVICE), qtype, n, k, layout)
    y = quant_matmul(torch.eye(k, dtype=dtype, device=DEVICE), packed, config=MatmulConfig(64, 32, 128))
    assert torch.equal(y.cpu(), expected)


@pytest.mark.parametrize("qtype", [T.IQ2_XS, T.IQ2_S], ids=lambda t: t.name)
def test_every_codebook_entry_is_exact(qtype: GGMLQuantizationType):
    raw, n, k = codebook_weight(qtype, seed=17)
    packed = pack_quant_weight(raw.to(DEVICE), qtype, n, k)
    y = quant_matmul(torch.eye(k, device=DEVICE), packed, config=MatmulConfig(64, 32, 128))
    assert torch.equal(y.cpu(), dequantize(raw, qtype, (n, k)).T)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [3, 16])
def test_agrees_with_matvec(qtype: GGMLQuantizationType, m: int):
    # In fp32 neither kernel rounds the weights, so they differ only in summation order.
    n, k = 40, k_for(qtype)
    raw = random_weight(qtype, n, k, seed=5).to(DEVICE)
    packed = pack_quant_weight(raw, qtype, n, k)
    x = torch.randn(m, k, device=DEVICE)
    y = quant_matmul(x, packed, config=MatmulConfig(16, 64, 128)).double()
    y_mv = quant_matvec(x, packed, qtype, n, k, config=MatvecConfig(16, 256)).double()
    bound = x.double().abs() @ dequantize(raw, qtype, (n, k)).double().abs().T
    assert ((y - y_mv).abs() <= 2e-5 * bound).all()


@cuda_only
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [64, 512])
@pytest.mark.parametrize("n,k", [(4864, 896), (18944, 3584)])
def test_model_shapes_cuda(qtype: GGMLQuantizationType, m: int, n: int, k: int):
    if k % GGML_QUANT_SIZES[qtype][0]:
        pytest.skip(f"k={k} is not a multiple of the {qtype.name} block")
    check(qtype, m, n, k, torch.bfloat16, None)


def test_default_config():
    small = default_config(T.Q4_K, 1, 4864, 896)
    assert (small.block_m, small.block_n) == (16, 16)
    assert default_config(T.Q4_K, 17, 4864, 896).block_n == 32
    assert default_config(T.Q4_K, 40, 4864, 896).block_m == 64
    wide = default_config(T.Q4_K, 16, 37888, 3584)  # gate+up, the output head
    assert (wide.block_m, wide.block_n, wide.block_k, wide.swap_ab) == (16, 64, 64, True)
    long_k = default_config(T.Q6_K, 64, 3584, 18944)  # down
    assert (long_k.block_m, long_k.block_n, long_k.block_k, long_k.swap_ab) == (64, 16, 256, False)
    large = default_config(T.Q4_K, 2048, 18944, 3584)
    assert (large.block_m, large.block_n, large.num_warps) == (256, 128, 8)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("shape", ["wide", "long_k"])
def test_default_tiles_of_model_shapes_match_reference(qtype: GGMLQuantizationType, shape: str):
    # The tiles default_config picks for the 7B's gate+up and down, on a small weight (n = 72: a partial
    # W tile).
    n, k = (37888, 3584) if shape == "wide" else (3584, 18944)
    check(qtype, 20, 72, 768, torch.bfloat16, default_config(qtype, 20, n, k))


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q5_0], ids=lambda t: t.name)
@pytest.mark.parametrize("swap_ab", [False, True])
def test_split_k_matches_reference(qtype: GGMLQuantizationType, swap_ab: bool):
    # 12 K steps of 64 in 5 splits of 3: the last split has none and adds a zero partial; partial row
    # and W tiles (m = 20, n = 72). Twice in a row: each launch's last split resets its counters.
    cfg = MatmulConfig(16, 32, 64, group_m=1, swap_ab=swap_ab, split_k=5)
    for _ in range(2):
        check(qtype, 20, 72, 768, torch.bfloat16, cfg)


def test_default_config_splits_k_of_narrow_weights():
    # 7B o at 16 rows: 224 tiles of 16 x 16, 28 K steps of 128; v: 32 tiles, at least 4 steps a split.
    assert default_config(T.Q4_K, 16, 3584, 3584).split_k == 1
    assert default_config(T.Q4_K, 64, 3584, 3584).split_k == 3
    assert default_config(T.Q6_K, 16, 512, 3584).split_k == 7
    assert default_config(T.Q4_K, 16, 37888, 3584).split_k == 1
    assert default_config(T.Q4_K, 16, 3584, 18944).split_k == 4  # down: long K
    assert default_config(T.Q4_K, 64, 3584, 18944).split_k == 1


def test_errors_name_the_problem():
    raw = random_weight(T.Q8_0, 4, 64, seed=1).to(DEVICE)
    packed = pack_quant_weight(raw, T.Q8_0, 4, 64)
    x = torch.randn(2, 64, device=DEVICE)
    with pytest.raises(TypeError, match="w must be a PackedQuantWeight"):
        quant_matmul(x, raw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"x must be \(M, 64\)"):
        quant_matmul(torch.randn(2, 32, device=DEVICE), packed)
    with pytest.raises(ValueError, match=r"x must be \(M, 64\)"):
        quant_matmul(torch.randn(0, 64, device=DEVICE), packed)
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        quant_matmul(x.double(), packed)
    with pytest.raises(ValueError, match="out must be"):
        quant_matmul(x, packed, out=torch.empty(2, 5, device=DEVICE))
    with pytest.raises(ValueError, match="out must be"):
        quant_matmul(x, packed, out=torch.empty(2, 4, device=DEVICE, dtype=torch.float16))
    with pytest.raises(ValueError, match="no fused matmul for GGML type Q3_K"):
        quant_matmul(x, PackedQuantWeight(T.Q3_K, 4, 64, packed.planes))
    with pytest.raises(ValueError, match="block_m must be at least 16"):
        MatmulConfig(block_m=8)
    with pytest.raises(ValueError, match="block_k must be a power of two"):
        MatmulConfig(block_k=96)
