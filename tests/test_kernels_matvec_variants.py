"""The matvec loop's variants (MatvecConfig's rows_at_once, flat_acc, scalar_scales,
prefetch with int8 x, max_registers, matched_loads): each against the kernel it varies (the same
sums, bit for bit in the interpreter) or against the reference within `check`'s tolerance where it
sums in another order, and the configs each one refuses. The kernels against the reference are in
test_kernels_quant_matvec."""

from __future__ import annotations

import os
from dataclasses import replace

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.kernels.quant_matvec import MatvecConfig, default_config, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import pack_quant_weight  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, check, cuda_only, k_for, random_weight  # noqa: E402


def rows_at_once_equals_row_by_row(m: int, n: int, k: int, split_k: int) -> None:
    # The same per-row arithmetic in the same order: the two variants must agree bit for bit.
    raw = random_weight(T.Q4_K, n, k, seed=m * 7 + n).to(DEVICE)
    packed = pack_quant_weight(raw, T.Q4_K, n, k, "planar")
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    x[-1, 32:64] = 0  # an all-zero sub-block: scale 0
    base = MatvecConfig(8, 128, split_k, int8_x=True)
    one = quant_matvec(x, packed, T.Q4_K, n, k, config=base)
    out = torch.full((m, n), float("nan"), dtype=x.dtype, device=DEVICE)
    at_once = quant_matvec(x, packed, T.Q4_K, n, k, out=out, config=replace(base, rows_at_once=True))
    assert torch.equal(one, at_once)


@pytest.mark.parametrize("m,split_k", [(1, 1), (3, 2), (5, 1)])
def test_int8_rows_at_once_is_bitwise_row_by_row(m: int, split_k: int):
    rows_at_once_equals_row_by_row(m, 21, k_for(T.Q4_K, 3), split_k)


@cuda_only
@pytest.mark.parametrize("m", [2, 4, 16])
def test_int8_rows_at_once_model_shapes_cuda(m: int):
    rows_at_once_equals_row_by_row(m, 3584, 18944, 2)


def test_rows_at_once_needs_the_int8_kernel():
    raw = random_weight(T.Q8_0, 4, 64, seed=1).to(DEVICE)
    with pytest.raises(ValueError, match="rows_at_once is implemented in the int8_x kernel only"):
        quant_matvec(
            torch.randn(1, 64, device=DEVICE), raw, T.Q8_0, 4, 64, config=MatvecConfig(rows_at_once=True)
        )


def assert_same_sums(x, packed, qtype, config, other) -> None:
    """Two configs that add the same products in the same order: equal bits in the interpreter; on
    the GPU the final sum over a step's sub-blocks may be reduced in another order (fp32 rounding,
    then one bf16 rounding). The second writes into a poisoned output."""
    m, (n, k) = x.shape[0], (packed.n, packed.k)
    expected = quant_matvec(x, packed, qtype, n, k, config=config)
    out = torch.full((m, n), float("nan"), dtype=x.dtype, device=DEVICE)
    got = quant_matvec(x, packed, qtype, n, k, out=out, config=other)
    if DEVICE == "cpu":
        assert torch.equal(got, expected)
    else:
        scale = expected.abs().max().item()
        torch.testing.assert_close(got.float(), expected.float(), rtol=2**-7, atol=1e-3 * scale)


@pytest.mark.parametrize("n,k,split_k", [(21, 3 * 256, 1), (37, 5 * 256, 2)])
def test_int8_flat_accumulator_gives_the_same_sums(n: int, k: int, split_k: int):
    # The same per-sub-block products added in the same order; only the final sum over the step's
    # sub-blocks may be reduced in another order on the GPU (fp32 rounding, then one bf16 rounding).
    raw = random_weight(T.Q4_K, n, k, seed=n).to(DEVICE)
    packed = pack_quant_weight(raw, T.Q4_K, n, k, "planar")
    x = torch.randn(1, k, device=DEVICE).bfloat16()
    base = MatvecConfig(8, 256, split_k, int8_x=True)
    assert_same_sums(x, packed, T.Q4_K, base, replace(base, flat_acc=True))
    with pytest.raises(ValueError, match="flat_acc is implemented for one row of x"):
        quant_matvec(x.repeat(2, 1), packed, T.Q4_K, n, k, config=replace(base, flat_acc=True))


@pytest.mark.parametrize(
    "m,n,k,block_k,split_k",
    # 768 over steps of 512 and 1,280 split three ways: partly filled steps, where the masks matter.
    [(1, 21, 3 * 256, 256, 1), (1, 37, 5 * 256, 256, 2), (1, 21, 3 * 256, 512, 1), (1, 19, 5 * 256, 256, 3),
     (2, 19, 3 * 256, 512, 1), (3, 19, 2 * 256, 256, 1)],
)  # fmt: skip
@pytest.mark.parametrize("layouts", [{"scalar_scales": True}])
def test_int8_load_layouts_give_the_same_sums(
    layouts: dict[str, bool], m: int, n: int, k: int, block_k: int, split_k: int
):
    # The same loads in another thread layout: the same products in the same order; only the final
    # sum over the step's sub-blocks may be reduced in another order on the GPU.
    raw = random_weight(T.Q4_K, n, k, seed=n + m).to(DEVICE)
    packed = pack_quant_weight(raw, T.Q4_K, n, k, "planar")
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    base = MatvecConfig(8, block_k, split_k, int8_x=True, flat_acc=m == 1)
    assert_same_sums(x, packed, T.Q4_K, base, replace(base, **layouts))
    with pytest.raises(ValueError, match="is implemented in Q4_K's"):
        quant_matvec(x, packed, T.Q4_K, n, k, config=replace(base, int8_x=False, **layouts))


@pytest.mark.parametrize(
    "m,n,k,split_k,loop",
    # Five steps (and a last one of them masked off by the split), one step, and two rows.
    [(1, 21, 5 * 256, 1, {"flat_acc": True, "scalar_scales": True}), (1, 37, 5 * 256, 2, {"flat_acc": True}),
     (1, 19, 256, 1, {"flat_acc": True, "scalar_scales": True}), (2, 19, 3 * 256, 1, {}),
     (3, 19, 3 * 256, 2, {"rows_at_once": True})],
)  # fmt: skip
def test_int8_prefetch_gives_the_same_sums(m: int, n: int, k: int, split_k: int, loop: dict[str, bool]):
    # The next step's weights loaded before this step computes: the same products in the same order.
    raw = random_weight(T.Q4_K, n, k, seed=n + 3 * m).to(DEVICE)
    packed = pack_quant_weight(raw, T.Q4_K, n, k, "planar")
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    base = MatvecConfig(8, 256, split_k, int8_x=True, **loop)
    assert_same_sums(x, packed, T.Q4_K, base, replace(base, prefetch=True))
    # A register cap changes where values live, not what is computed.
    assert_same_sums(x, packed, T.Q4_K, base, replace(base, prefetch=True, max_registers=96))
    q6 = random_weight(T.Q6_K, n, 256, seed=n).to(DEVICE)
    with pytest.raises(ValueError, match="MatvecConfig.prefetch needs Q4_K's planar layout"):
        quant_matvec(x[:, :256], q6, T.Q6_K, n, 256, config=MatvecConfig(int8_x=False, prefetch=True))


@pytest.mark.parametrize(
    "m,n,k,block_k,split_k,scalar",
    # Five steps of 256 (the last one's loads of the step after masked off), four of 512 split in
    # two, one step, and three rows.
    [(1, 21, 5 * 256, 256, 1, False), (1, 37, 8 * 256, 512, 2, True), (1, 19, 256, 256, 1, True),
     (3, 19, 3 * 256, 256, 1, False)],
)  # fmt: skip
def test_q6_k_int8_prefetch_gives_the_same_sums(
    m: int, n: int, k: int, block_k: int, split_k: int, scalar: bool
):
    raw = random_weight(T.Q6_K, n, k, seed=n + 5 * m).to(DEVICE)
    packed = pack_quant_weight(raw, T.Q6_K, n, k, q6k_layout="blocks")
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    base = MatvecConfig(16, block_k, split_k, int8_x=True, scalar_scales=scalar)
    assert_same_sums(x, packed, T.Q6_K, base, replace(base, prefetch=True))


@pytest.mark.parametrize("m,n,k,split_k", [(1, 21, 2 * 256, 1), (1, 37, 5 * 256, 2), (3, 19, 2 * 256, 1)])
def test_q6_k_int8_scalar_scales_give_the_same_sums(m: int, n: int, k: int, split_k: int):
    # As for Q4_K above: the same loads in the products' layout; on the GPU only the final sum over a
    # step's groups may be reduced in another order.
    raw = random_weight(T.Q6_K, n, k, seed=n + m).to(DEVICE)
    packed = pack_quant_weight(raw, T.Q6_K, n, k, q6k_layout="blocks")
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    base = MatvecConfig(8, 512, split_k, int8_x=True)
    assert_same_sums(x, packed, T.Q6_K, base, replace(base, scalar_scales=True))
    with pytest.raises(
        ValueError, match="scalar_scales is implemented in Q4_K's and Q6_K's int8_x kernels only"
    ):
        quant_matvec(x, packed, T.Q6_K, n, k, config=replace(base, int8_x=False, scalar_scales=True))


def test_max_registers_bounds():
    with pytest.raises(ValueError, match="MatvecConfig.max_registers must be from 24 to 255"):
        MatvecConfig(max_registers=300)


def test_default_tiles_of_the_q4_k_int8_matvec():
    # Scales in the words' layout and 8 x 2,048 tiles on the 7B's weights (measured faster), the
    # vectorized scales elsewhere (the 0.5B's down, output heads: not measured faster).
    for n, k in ((4608, 3584), (37888, 3584), (3584, 18944)):
        cfg = default_config(T.Q4_K, 1, n, k, planar_int8=True)
        assert cfg == MatvecConfig(8, 2048, cfg.split_k, 4, flat_acc=True, scalar_scales=True)
    for n, k in ((896, 4864), (151936, 896)):
        cfg = default_config(T.Q4_K, 1, n, k, planar_int8=True)
        assert cfg.flat_acc and not cfg.scalar_scales


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q5_0], ids=lambda t: t.name)
@pytest.mark.parametrize(
    "n,k,split_k,dtype", [(21, 7 * 32, 1, torch.bfloat16), (37, 40 * 32, 3, torch.float32)]
)
def test_matched_loads_match_reference(qtype: T, n: int, k: int, split_k: int, dtype: torch.dtype):
    # fp32 sums in another order (8 elements, then d, then the accumulator): `check`'s tolerance.
    check(qtype, 1, n, k, dtype, MatvecConfig(8, 128, split_k, matched_loads=True))
    raw = random_weight(qtype, n, k, seed=1)
    packed = pack_quant_weight(raw.to(DEVICE), qtype, n, k)
    x = torch.randn(2, k, device=DEVICE).to(dtype)
    with pytest.raises(ValueError, match="matched_loads is implemented for one row of x"):
        quant_matvec(x, packed, qtype, n, k, config=MatvecConfig(8, 128, split_k, matched_loads=True))


@pytest.mark.parametrize("n,k,split_k", [(21, 7 * 32, 1), (37, 40 * 32, 3)])
def test_q5_0_flat_accumulator_matches_reference(n: int, k: int, split_k: int):
    # fp32 sums in another order than the per-step reductions: `check`'s reference tolerance applies.
    check(T.Q5_0, 1, n, k, torch.bfloat16, MatvecConfig(8, 128, split_k, flat_acc=True))


PAIRED_DM_CONFIGS = [
    MatvecConfig(8, 256, 2, int8_x=False),  # the fp32-x planar kernel
    MatvecConfig(8, 256, 1, int8_x=False, prefetch=True),
    MatvecConfig(8, 512, 2, int8_x=True, flat_acc=True, scalar_scales=True),  # the 7B's tile family
    MatvecConfig(8, 256, 1, int8_x=True, flat_acc=True, prefetch=True),
    MatvecConfig(8, 256, 2, int8_x=True, rows_at_once=True),
]


# flat_acc is a one-row variant.
PAIRED_DM_CASES = [(c, m) for c in PAIRED_DM_CONFIGS for m in (1, 3) if m == 1 or not c.flat_acc]


@pytest.mark.parametrize("config,m", PAIRED_DM_CASES, ids=range(len(PAIRED_DM_CASES)))
def test_paired_dm_loads_the_same_scales(config: MatvecConfig, m: int):
    # d and dmin from one 32-bit word instead of two 16-bit loads: the same values, so the same sums
    # bit for bit (the same kernel otherwise). Five super-blocks of rows that are not a tile multiple.
    n, k = 37, 5 * 256
    packed = pack_quant_weight(random_weight(T.Q4_K, n, k, seed=40 + m).to(DEVICE), T.Q4_K, n, k, "planar")
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    expected = quant_matvec(x, packed, T.Q4_K, n, k, config=config)
    out = torch.full((m, n), float("nan"), dtype=x.dtype, device=DEVICE)
    got = quant_matvec(x, packed, T.Q4_K, n, k, out=out, config=replace(config, paired_dm=True))
    assert torch.equal(got, expected)


def test_paired_dm_needs_the_planar_layout():
    raw = random_weight(T.Q6_K, 4, 256, seed=2).to(DEVICE)
    with pytest.raises(ValueError, match="paired_dm is implemented in Q4_K's planar kernels only, not Q6_K"):
        quant_matvec(
            torch.randn(1, 256, device=DEVICE), raw, T.Q6_K, 4, 256, config=MatvecConfig(paired_dm=True)
        )
