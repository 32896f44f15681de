"""The fused dequant + matvec kernels against strata.quant.dequantize then a float64 matmul.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here before triton is
imported, since `triton.jit` picks the interpreter when a kernel is decorated) at small sizes; with
CUDA they run compiled, at the same sizes plus model-sized ones.

Tolerance: |y - ref| <= eps(out dtype) * |ref| + 1e-5 * (|x| @ |W|^T). The first term is rounding y
to its dtype; the second covers fp32 accumulation in another order than the reference (typical error
about sqrt(K) * 2^-24 of the absolute sum, here under 4e-6 at K <= 1536; a wrong scale, nibble or
block gives errors of the order of |ref| itself, hundreds of times larger).
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402

pytest.importorskip("triton")

from strata.kernels.int8_inputs import quantize_x  # noqa: E402
from strata.kernels.quant_matvec import MAX_M, MatvecConfig, default_config, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import pack_quant_weight  # noqa: E402
from strata.quant import dequantize  # noqa: E402

T = GGMLQuantizationType
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="model-sized shapes run only on CUDA")

# Byte offsets of the fp16 scale fields (d, dmin) in a block; random bytes there may be Inf/NaN.
SCALE_OFFSETS = {
    T.Q8_0: (0,),
    T.Q5_0: (0,),
    T.Q4_0: (0,),
    T.Q4_K: (0, 2),
    T.Q6_K: (208,),
    T.Q2_K: (80, 82),
    T.IQ4_XS: (0,),
    T.IQ2_XS: (0,),
    T.IQ2_S: (0,),
}
TYPES = list(SCALE_OFFSETS)


@pytest.fixture(autouse=True)
def blocks_layout_unless_asked(monkeypatch):
    # Q4_K packs planar by default (int8 x for 16-bit x); the generic tests check the block kernels'
    # exact fp32 arithmetic, and the planar tests set their layout themselves.
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "blocks")


def random_weight(qtype: GGMLQuantizationType, n: int, k: int, seed: int) -> torch.Tensor:
    """Fresh random GGUF bytes of an (n, k) weight, every fp16 scale finite and varying per block."""
    rng = np.random.default_rng(seed)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    num_blocks = n * k // block_size
    raw = rng.integers(0, 256, (num_blocks, type_size), dtype=np.uint8)
    for off in SCALE_OFFSETS[qtype]:
        scale = rng.uniform(0.001, 0.1, num_blocks) * rng.choice([-1.0, 1.0], num_blocks)
        raw[:, off : off + 2] = scale.astype(np.float16).view(np.uint8).reshape(num_blocks, 2)
    return torch.from_numpy(raw.reshape(-1))


def codebook_weight(qtype: GGMLQuantizationType, seed: int) -> tuple[torch.Tensor, int, int]:
    """Random IQ2_XS / IQ2_S bytes, one 256-element block per row, whose grid indices run through the
    whole grid in order (and IQ2_XS's sign codes through all 128); returns (raw, n, k)."""
    index = np.arange(512 if qtype == T.IQ2_XS else 1024)
    n, k = len(index) // 32, 256  # a block holds 32 grid entries
    raw = random_weight(qtype, n, k, seed).numpy().reshape(n, GGML_QUANT_SIZES[qtype][1])
    if qtype == T.IQ2_XS:
        raw[:, 2:66] = (index | (index % 128) << 9).astype(np.uint16).view(np.uint8).reshape(n, 64)
    else:
        raw[:, 2:34] = (index & 255).reshape(n, 32)
        high = (index >> 8).reshape(n, 8, 4) << np.array([0, 2, 4, 6])
        raw[:, 66:74] = high.sum(-1)
    return torch.from_numpy(raw.reshape(-1)), n, k


def check(
    qtype: GGMLQuantizationType,
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    config: MatvecConfig | None,
    raw: torch.Tensor | None = None,
):
    if raw is None:
        raw = random_weight(qtype, n, k, seed=hash((qtype, m, n, k)) % 2**32)
    w = dequantize(raw, qtype, (n, k)).double()
    x = torch.randn(m, k, dtype=torch.float64).to(dtype)
    ref = x.double() @ w.T
    bound = x.double().abs() @ w.abs().T
    packed = pack_quant_weight(raw.to(DEVICE), qtype, n, k)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
    # The fp32-product kernels (16-bit x of STRATA_INT8_X's types goes int8 by default: check_int8).
    exact = replace(config or default_config(qtype, m, n, k), int8_x=False)
    y = quant_matvec(x.to(DEVICE), packed, qtype, n, k, out=out, config=exact)
    assert y is out
    y = y.cpu().double()
    assert torch.isfinite(y).all(), f"{qtype.name}: non-finite outputs remain (poisoned with NaN)"
    err = (y - ref).abs()
    tol = torch.finfo(dtype).eps * ref.abs() + 1e-5 * bound
    worst = (err / tol).max().item()
    assert (err <= tol).all(), f"{qtype.name} m={m} n={n} k={k} {dtype} {config}: error/tol up to {worst:.2f}"


def k_for(qtype: GGMLQuantizationType, blocks: int) -> int:
    return GGML_QUANT_SIZES[qtype][0] * blocks


# (m, dtype, config): ragged tiles everywhere (n = 37 is no multiple of block_n; k is no multiple of
# block_k * split_k), splits 1, 3 and 8, and M = 1, 3 and 16.
CASES = [
    (1, torch.float16, MatvecConfig(16, 256, 1)),
    (3, torch.bfloat16, MatvecConfig(8, 128, 3)),
    (16, torch.float32, None),
    (1, torch.float32, MatvecConfig(32, 512, 8)),
]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m,dtype,config", CASES, ids=lambda c: str(c)[:24])
def test_matches_reference(
    qtype: GGMLQuantizationType, m: int, dtype: torch.dtype, config: MatvecConfig | None
):
    blocks = 11 if GGML_QUANT_SIZES[qtype][0] == 32 else 5  # k = 352 or 1280
    check(qtype, m, 37, k_for(qtype, blocks), dtype, config)


@pytest.mark.parametrize("m,dtype,config", CASES, ids=lambda c: str(c)[:24])
def test_q4_k_planar_matches_reference(monkeypatch, m: int, dtype: torch.dtype, config: MatvecConfig | None):
    # The same cases through Q4_K's planar layout and its own kernel (whole sub-blocks per thread),
    # x kept in floating point (the int8 path has its own tests below).
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    assert pack_quant_weight(random_weight(T.Q4_K, 1, 256, 0), T.Q4_K, 1, 256).layout == "planar"
    k = k_for(T.Q4_K, 5)
    check(T.Q4_K, m, 37, k, dtype, float_x(config or default_config(T.Q4_K, m, 37, k)))


def float_x(config: MatvecConfig) -> MatvecConfig:
    return MatvecConfig(**{**config.__dict__, "int8_x": False})


@pytest.mark.parametrize(
    "m,dtype,split_k", [(1, torch.float32, 1), (3, torch.bfloat16, 3), (16, torch.float16, 2)]
)
def test_q4_k_planar_prefetch_matches_reference(monkeypatch, m: int, dtype: torch.dtype, split_k: int):
    # The prefetching loop: its look-ahead loads past each split's end must be masked off.
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    check(T.Q4_K, m, 37, k_for(T.Q4_K, 5), dtype, MatvecConfig(8, 128, split_k, prefetch=True, int8_x=False))


def _quantized_x(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What quantize_x must give: q = x * (127 / max|x|) in fp32, rounded half away from zero, and
    dx = max|x| / 127 (fp32 values, returned as float64)."""
    xb = x.float().view(x.shape[0], -1, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    # tensor / tensor rounds correctly (a scalar / tensor multiplies by a reciprocal).
    v = xb * torch.where(amax > 0, torch.full_like(amax, 127.0) / torch.where(amax > 0, amax, 1.0), 0.0)
    return (torch.sign(v) * torch.floor(v.abs() + 0.5)).double(), (
        amax / torch.full_like(amax, 127.0)
    ).double()


@pytest.mark.parametrize("planar", [True, False], ids=["planar order", "element order"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_quantize_x_matches_reference(dtype: torch.dtype, planar: bool):
    m, k = 3, 1312  # 41 sub-blocks: a partial program of 32
    x = (torch.randn(m, k) * torch.rand(m, k // 32, 1).repeat_interleave(32, 1).view(m, k) * 4).to(dtype)
    x[1, 64:96] = 0  # an all-zero sub-block: dx = 0, q = 0
    xq, xd, xs = (t.cpu() for t in quantize_x(x.to(DEVICE), planar=planar))
    q, dx = _quantized_x(x)
    shifts = 8 * torch.arange(4)
    if planar:  # element 8b + 4h + r of a sub-block is byte b of word 4h + r
        b = (xq.view(m, -1, 1, 8) >> shifts.view(1, 1, 4, 1)) & 255
    else:  # element 4j + b is byte b of word j
        b = (xq.view(m, -1, 8, 1) >> shifts.view(1, 1, 1, 4)) & 255
    got = ((b ^ 128) - 128).reshape(m, -1, 32)
    assert torch.equal(got.double(), q), "int8 values or their packing differ"
    assert torch.equal(xd.double(), dx.squeeze(-1))
    assert torch.allclose(xs.double(), x.double().view(m, -1, 32).sum(-1), rtol=1e-5, atol=1e-5)


def check_int8(
    m: int, n: int, k: int, dtype: torch.dtype, config: MatvecConfig | None, qtype: T = T.Q4_K
) -> None:
    """The int8 path against its own arithmetic (fp32 rounding only): W (q * dx), with Q4_K's min term
    taken from the exact sum of x; and against the fp32 product within the quantization bound."""
    raw = random_weight(qtype, n, k, seed=m + n + 100)
    x = torch.randn(m, k).to(dtype)
    x[0, :32] = 0
    # The planar / blocks int8 kernels, which a MatvecConfig launches (the rows layouts' kernels:
    # test_kernels_q4k_rows.py, test_kernels_q6k_rows.py).
    packed = pack_quant_weight(raw.to(DEVICE), qtype, n, k, "planar", q6k_layout="blocks")
    cfg = replace(config or default_config(qtype, m, n, k), int8_x=True)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
    y = quant_matvec(x.to(DEVICE), packed, qtype, n, k, out=out, config=cfg).cpu().double()
    w = dequantize(raw, qtype, (n, k)).double()
    q, dx = _quantized_x(x)
    xhat = (q * dx).view(m, k)
    own = xhat @ w.T
    if qtype == T.Q4_K:
        _, _, mn, dm = (p.cpu() for p in packed.planes)
        d_mn = dm.view(n, -1, 2)[..., 1].double().repeat_interleave(8, 1) * mn.double()  # (n, k / 32)
        own += (xhat.view(m, -1, 32).sum(-1) - x.double().view(m, -1, 32).sum(-1)) @ d_mn.T
    scale = xhat.abs() @ w.abs().T + x.double().abs() @ w.abs().T
    assert ((y - own).abs() <= torch.finfo(dtype).eps * own.abs() + 1e-5 * scale).all()
    ref = x.double() @ w.T
    bound = (dx.expand(-1, -1, 32).reshape(m, k) / 2) @ w.abs().T
    assert ((y - ref).abs() <= bound + torch.finfo(dtype).eps * ref.abs() + 1e-5 * scale).all()


@pytest.mark.parametrize("m,dtype,config", CASES, ids=lambda c: str(c)[:24])
def test_q4_k_int8_x(m: int, dtype: torch.dtype, config: MatvecConfig | None):
    check_int8(m, 37, k_for(T.Q4_K, 5), dtype, config)


@pytest.mark.parametrize("qtype", [T.Q6_K, T.Q8_0, T.Q5_0], ids=lambda t: t.name)
@pytest.mark.parametrize("m,dtype,config", CASES, ids=lambda c: str(c)[:24])
def test_opt_in_int8_x(m: int, dtype: torch.dtype, config: MatvecConfig | None, qtype: T):
    check_int8(m, 37, k_for(qtype, 5 if qtype == T.Q6_K else 40), dtype, config, qtype)


@cuda_only
@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("n,k", [(4864, 896 + 128), (896, 4864), (3584, 3584)])
def test_q4_k_int8_x_model_shapes_cuda(m: int, n: int, k: int):
    check_int8(m, n, k, torch.bfloat16, None)


@cuda_only
@pytest.mark.parametrize("qtype", [T.Q6_K, T.Q8_0, T.Q5_0], ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("n,k", [(896, 4864), (3584, 18944), (151936, 896)])
def test_opt_in_int8_x_model_shapes_cuda(m: int, n: int, k: int, qtype: T):
    if k % GGML_QUANT_SIZES[qtype][0]:
        pytest.skip(f"k={k} is not a multiple of the {qtype.name} block")  # the 0.5B head is never Q6_K
    check_int8(m, n, k, torch.bfloat16, None, qtype)


def test_strata_int8_x_picks_the_types(monkeypatch):
    monkeypatch.setenv("STRATA_Q6K_LAYOUT", "blocks")  # whose int8 kernel a MatvecConfig launches
    n, k = 8, 512
    raw = random_weight(T.Q6_K, n, k, seed=5).to(DEVICE)
    x = torch.randn(2, k, device=DEVICE).bfloat16()
    tile = MatvecConfig(16, 256)  # int8_x None: STRATA_INT8_X decides
    exact = quant_matvec(x, raw, T.Q6_K, n, k, config=replace(tile, int8_x=False))
    forced = quant_matvec(x, raw, T.Q6_K, n, k, config=replace(tile, int8_x=True))
    assert not torch.equal(exact, forced)  # the two paths differ, so the checks below mean something
    monkeypatch.delenv("STRATA_INT8_X", raising=False)
    assert torch.equal(quant_matvec(x, raw, T.Q6_K, n, k, config=tile), forced)  # Q6_K's default
    monkeypatch.setenv("STRATA_INT8_X", "q4_k")
    assert torch.equal(quant_matvec(x, raw, T.Q6_K, n, k, config=tile), exact)
    monkeypatch.setenv("STRATA_INT8_X", "Q8_0+q6_k")
    assert torch.equal(quant_matvec(x, raw, T.Q6_K, n, k, config=tile), forced)
    monkeypatch.setenv("STRATA_INT8_X", "none")
    assert torch.equal(quant_matvec(x, raw, T.Q6_K, n, k, config=tile), exact)
    monkeypatch.setenv("STRATA_INT8_X", "Q6_K,Q7_K")
    with pytest.raises(ValueError, match="STRATA_INT8_X='Q6_K,Q7_K' names Q7_K"):
        quant_matvec(x, raw, T.Q6_K, n, k, config=tile)


def test_int8_x_is_the_default_for_16_bit_x_only(monkeypatch):
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
    n, k = 8, 256
    raw = random_weight(T.Q4_K, n, k, seed=9).to(DEVICE)
    x = torch.randn(1, k, device=DEVICE)
    exact = quant_matvec(x, raw, T.Q4_K, n, k)
    ref = x.double().cpu() @ dequantize(raw.cpu(), T.Q4_K, (n, k)).double().T
    assert torch.allclose(exact.cpu().double(), ref, rtol=1e-5, atol=1e-4)  # fp32 x: no quantization
    fast = quant_matvec(x.bfloat16(), raw, T.Q4_K, n, k).float()
    forced = quant_matvec(x.bfloat16(), raw, T.Q4_K, n, k, config=MatvecConfig(8, 256, int8_x=True)).float()
    assert torch.equal(fast, forced)


def test_prefetch_and_int8_x_need_their_kernels():
    raw = random_weight(T.Q8_0, 4, 64, seed=1).to(DEVICE)
    x = torch.randn(1, 64, device=DEVICE)
    with pytest.raises(ValueError, match="prefetch needs Q4_K.s planar layout"):
        quant_matvec(x, raw, T.Q8_0, 4, 64, config=MatvecConfig(prefetch=True))
    raw = random_weight(T.Q4_0, 4, 64, seed=1).to(DEVICE)
    with pytest.raises(ValueError, match="int8_x needs Q4_K.s planar layout .* or Q5_0, not Q4_0"):
        quant_matvec(x, raw, T.Q4_0, 4, 64, config=MatvecConfig(int8_x=True))


@pytest.mark.parametrize("layout", ["blocks", "planar"])
def test_q4_k_layouts_agree(layout: str):
    # Both layouts hold the same values: the two kernels differ only in fp32 summation order.
    n, k = 19, k_for(T.Q4_K, 3)
    raw = random_weight(T.Q4_K, n, k, seed=21).to(DEVICE)
    x = torch.randn(2, k, device=DEVICE)
    cfg = MatvecConfig(8, 256, 2)
    y = quant_matvec(x, pack_quant_weight(raw, T.Q4_K, n, k, layout), T.Q4_K, n, k, config=cfg)
    y_raw = quant_matvec(x, raw, T.Q4_K, n, k, config=cfg)
    bound = x.double().abs() @ dequantize(raw.cpu(), T.Q4_K, (n, k)).double().abs().T.to(DEVICE)
    assert ((y.double() - y_raw.double()).abs() <= 2e-6 * bound).all()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_raw_bytes_and_one_row(qtype: GGMLQuantizationType):
    # Unpacked bytes are packed by the call itself; a single output row and a single K block.
    k = k_for(qtype, 1)
    raw = random_weight(qtype, 1, k, seed=7)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(7))
    terms = x.double() * dequantize(raw, qtype, (1, k)).double()
    y = quant_matvec(x.to(DEVICE), raw.to(DEVICE), qtype, 1, k).cpu().double()
    # fp32 accumulation: each of the k products and partial sums rounds by up to 2**-24 of its size,
    # so the error is within about k * 2**-24 * sum(|terms|) (twice that here), whatever the sum itself.
    bound = 2 * k * 2.0**-24 * terms.abs().sum()
    assert abs(y.item() - terms.sum().item()) <= bound + 1e-6


@pytest.mark.parametrize("qtype", [T.IQ2_XS, T.IQ2_S], ids=lambda t: t.name)
def test_every_codebook_entry(qtype: GGMLQuantizationType):
    raw, n, k = codebook_weight(qtype, seed=13)
    check(qtype, 2, n, k, torch.float32, MatvecConfig(16, 128, 2), raw=raw)


BIAS_CASES = [(t, "blocks") for t in (T.Q8_0, T.Q4_K, T.Q2_K, T.IQ4_XS, T.IQ2_XS, T.IQ2_S)] + [
    (T.Q4_K, "planar")
]


@pytest.mark.parametrize("qtype,layout", BIAS_CASES, ids=lambda c: getattr(c, "name", c))
@pytest.mark.parametrize("split_k", [1, 3])
def test_bias_is_added_once(monkeypatch, qtype: GGMLQuantizationType, layout: str, split_k: int):
    # With split-K only split 0 adds the bias; a bias added per split would be off by (splits - 1) * b.
    monkeypatch.setenv("STRATA_Q4K_LAYOUT", layout)
    n, k = 37, k_for(qtype, 5 if GGML_QUANT_SIZES[qtype][0] == 256 else 11)
    raw = random_weight(qtype, n, k, seed=11)
    x = torch.randn(3, k)
    bias = torch.randn(n) * 10
    w = dequantize(raw, qtype, (n, k)).double()
    ref = x.double() @ w.T + bias.double()
    # `check`'s fp32 term (0.01-0.4 here); a bias added per split would be off by about 10.
    bound = x.double().abs() @ w.abs().T + bias.double().abs()
    out = torch.full((3, n), float("nan"), device=DEVICE)
    cfg = MatvecConfig(16, k_for(qtype, 1) * 2 if qtype == T.Q4_K else 128, split_k)
    y = quant_matvec(x.to(DEVICE), raw.to(DEVICE), qtype, n, k, out=out, config=cfg, bias=bias.to(DEVICE))
    assert ((y.cpu().double() - ref).abs() <= 1e-5 * bound).all()


def test_split_locks_grow_without_freeing_the_smaller_set():
    # A CUDA graph captured with the smaller set keeps its address: it must stay allocated and zero.
    from strata.kernels.split_locks import _LOCKS, split_locks

    small = split_locks(torch.device(DEVICE), 3)
    big = split_locks(torch.device(DEVICE), small.numel() + 1)
    assert big.numel() > small.numel() and big.data_ptr() != small.data_ptr()
    assert split_locks(torch.device(DEVICE), 3).data_ptr() == big.data_ptr()
    assert not small.any() and not big.any()
    assert small.data_ptr() in [t.data_ptr() for sets in _LOCKS.values() for t in sets]
    if DEVICE == "cuda":  # launches on another stream may run alongside: they get a set of their own
        with torch.cuda.stream(torch.cuda.Stream()):
            assert split_locks(torch.device(DEVICE), 3).data_ptr() not in (small.data_ptr(), big.data_ptr())


@pytest.mark.parametrize("qtype,int8_x", [(T.Q8_0, False), (T.Q6_K, True)], ids=["Q8_0", "Q6_K int8"])
def test_split_k_counters_are_reset_for_the_next_launch(
    monkeypatch, qtype: GGMLQuantizationType, int8_x: bool
):
    monkeypatch.setenv("STRATA_Q6K_LAYOUT", "blocks")  # whose int8 kernel a MatvecConfig launches
    # The last split of each row tile sums the partials and zeroes its counter; a counter left behind
    # would make a later launch finish a tile early (or never), from a partial sum.
    from strata.kernels.split_locks import split_locks

    n, k = 37, k_for(qtype, 4)
    raw = random_weight(qtype, n, k, seed=5).to(DEVICE)
    cfg = MatvecConfig(16, k // 4, 4, int8_x=int8_x)
    ys = []
    for seed in (1, 2, 1):
        x = torch.randn(2, k, generator=torch.Generator().manual_seed(seed)).to(DEVICE, torch.bfloat16)
        out = torch.full((2, n), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        ys.append(quant_matvec(x, raw, qtype, n, k, out=out, config=cfg))
        assert not split_locks(x.device, 3).any()
    unsplit = quant_matvec(x, raw, qtype, n, k, config=replace(cfg, split_k=1))
    assert torch.equal(ys[0], ys[2]) and not torch.equal(ys[0], ys[1])
    # Split order differs from one unsplit pass only in fp32 rounding, then one bf16 rounding.
    torch.testing.assert_close(
        ys[2].float(), unsplit.float(), rtol=2**-7, atol=1e-3 * unsplit.abs().max().item()
    )


@cuda_only
@pytest.mark.parametrize("qtype", [*TYPES, "Q4_K planar"], ids=lambda t: getattr(t, "name", t))
@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("n,k", [(4864, 896), (896, 4864), (3584, 3584)])
def test_model_shapes_cuda(monkeypatch, qtype, m: int, n: int, k: int):
    config = None
    if qtype == "Q4_K planar":  # x in floating point; the int8 path has its own model-shape test
        monkeypatch.setenv("STRATA_Q4K_LAYOUT", "planar")
        qtype = T.Q4_K
        config = float_x(default_config(T.Q4_K, m, n, k))
    if k % GGML_QUANT_SIZES[qtype][0]:
        pytest.skip(f"k={k} is not a multiple of the {qtype.name} block")
    check(qtype, m, n, k, torch.bfloat16, config)


def test_default_config_splits_small_n():
    cfg = default_config(T.Q4_K, 1, 896, 4864)
    assert cfg.split_k > 1
    assert default_config(T.Q4_K, 1, 18944, 3584).split_k == 1


def test_errors_name_the_problem():
    raw = random_weight(T.Q8_0, 4, 64, seed=1).to(DEVICE)
    x = torch.randn(1, 64, device=DEVICE)
    with pytest.raises(ValueError, match="takes 272 bytes"):
        quant_matvec(x, raw[:-1], T.Q8_0, 4, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        quant_matvec(x, raw, T.Q8_0, 4, 60)
    with pytest.raises(ValueError, match=r"x must be \(M, 64\)"):
        quant_matvec(torch.randn(1, 32, device=DEVICE), raw, T.Q8_0, 4, 64)
    with pytest.raises(ValueError, match=f"1 to {MAX_M}"):
        quant_matvec(torch.randn(MAX_M + 1, 64, device=DEVICE), raw, T.Q8_0, 4, 64)
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        quant_matvec(x.double(), raw, T.Q8_0, 4, 64)
    with pytest.raises(ValueError, match="no fused matvec for GGML type Q3_K"):
        quant_matvec(x, raw, T.Q3_K, 4, 64)
    with pytest.raises(ValueError, match="out must be"):
        quant_matvec(x, raw, T.Q8_0, 4, 64, out=torch.empty(1, 5, device=DEVICE))
    packed = pack_quant_weight(raw, T.Q8_0, 4, 64)
    with pytest.raises(ValueError, match="packed weight is Q8_0"):
        quant_matvec(x, packed, T.Q8_0, 2, 128)
    with pytest.raises(ValueError, match="multiple of 128"):
        quant_matvec(
            torch.randn(1, 256, device=DEVICE), random_weight(T.Q6_K, 1, 256, 2).to(DEVICE), T.Q6_K, 1, 256,
            config=MatvecConfig(16, 64),
        )  # fmt: skip
