"""Q8_0's and Q5_0's dp4a matvec with a whole block a lane (`_matvec_legacy_int8_blocks`,
`MatvecConfig.lane_blocks`): against the int8 path's own arithmetic and the fp32 product
(`check_int8`) for 1-4 rows of x, against the kernels it would replace (the half-block matched loop
at one row, the plain loop at several: the same integer dot products, each block's scaled once
instead of per half: fp32 rounding apart), its preloaded step bit for bit against its loop, the tiles
STRATA_INT8_LANE_BLOCKS gives, and the configs refused."""

from __future__ import annotations

import os
from dataclasses import replace

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.kernels.matvec_tiles import env_tile  # noqa: E402
from strata.kernels.quant_matvec import MatvecConfig, default_config, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import pack_quant_weight  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, check_int8, cuda_only, k_for, random_weight  # noqa: E402

QTYPES = pytest.mark.parametrize("qtype", [T.Q8_0, T.Q5_0], ids=lambda t: t.name)
LANES = MatvecConfig(8, 256, 1, int8_x=True, matched_loads=True, lane_blocks=True)


def run(
    qtype: T, n: int, k: int, configs: list[MatvecConfig], seed: int = 0, m: int = 1
) -> list[torch.Tensor]:
    """Each config's product of m fp32 rows (an all-zero block among the first's blocks: scale 0), in
    fp32 so that the sums' rounding shows."""
    packed = pack_quant_weight(random_weight(qtype, n, k, seed=seed).to(DEVICE), qtype, n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    x[0, 32:64] = 0
    outs = []
    for cfg in configs:
        out = torch.full((m, n), float("nan"), dtype=torch.float32, device=DEVICE)
        outs.append(quant_matvec(x, packed, qtype, n, k, out=out, config=cfg))
    return outs


@QTYPES
@pytest.mark.parametrize(
    "n,blocks,block_n,block_k,split_k",
    [(37, 40, 8, 256, 1), (21, 7, 16, 256, 3), (64, 28, 8, 1024, 1), (9, 70, 32, 512, 2)],
)
def test_against_reference(qtype: T, n: int, blocks: int, block_n: int, block_k: int, split_k: int):
    # rows of a lane (8 rows at 4 warps: one; 16 or 32: several), blocks a lane (7 of 8: masked; 70
    # over 512: several steps), split K
    config = replace(LANES, block_n=block_n, block_k=block_k, split_k=split_k)
    check_int8(1, n, k_for(qtype, blocks), torch.bfloat16, config, qtype)


@QTYPES
@pytest.mark.parametrize("m,block_n,split_k", [(2, 16, 1), (3, 16, 2), (4, 8, 1)])
def test_rows_of_x(qtype: T, m: int, block_n: int, split_k: int):
    # batched decode: each row of x its own accumulator; against the reference, and against the plain
    # int8 loop (which runs there without it)
    lanes = MatvecConfig(block_n, 256, split_k, int8_x=True, lane_blocks=True)
    check_int8(m, 37, k_for(qtype, 40), torch.bfloat16, lanes, qtype)
    plain, whole = run(qtype, 37, 40 * 32, [replace(lanes, lane_blocks=False), lanes], m=m)
    assert torch.isfinite(whole).all()
    assert torch.allclose(whole, plain, rtol=1e-5, atol=1e-5 * plain.abs().max().item())


@QTYPES
@pytest.mark.parametrize("n,k,block_k,split_k", [(37, 40 * 32, 256, 2), (16, 896, 1024, 1)])
def test_against_the_half_block_kernel(qtype: T, n: int, k: int, block_k: int, split_k: int):
    lanes = replace(LANES, block_k=block_k, split_k=split_k)
    halves, whole = run(qtype, n, k, [replace(lanes, lane_blocks=False), lanes])
    assert torch.isfinite(whole).all()
    assert torch.allclose(whole, halves, rtol=1e-5, atol=1e-5 * halves.abs().max().item())


@QTYPES
@pytest.mark.parametrize("n,k", [(37, 896), (16, 2048)])
def test_preloaded_step_is_the_loop_bit_for_bit(qtype: T, n: int, k: int):
    block_k = 1 << (k - 1).bit_length()
    lanes = replace(LANES, block_k=block_k, num_warps=8)
    loop, step = run(qtype, n, k, [lanes, replace(lanes, preload=True)], seed=3)
    assert torch.equal(step, loop)


@QTYPES
@pytest.mark.parametrize("n,k", [(9728, 896), (64, 4096)])
def test_the_setting_gives_both_tiles(qtype: T, n: int, k: int, monkeypatch):
    w = pack_quant_weight(random_weight(qtype, 64, 256, 0).to(DEVICE), qtype, 64, 256)
    w = replace(w, n=n, k=k)  # only the shape matters to the tile
    default = default_config(qtype, 1, n, k)
    monkeypatch.delenv("STRATA_INT8_LANE_BLOCKS", raising=False)
    off = env_tile(default, w, 1, int8_x=True)
    monkeypatch.setenv("STRATA_INT8_LANE_BLOCKS", "1")
    on = env_tile(default, w, 1, int8_x=True)
    assert not off.lane_blocks and on.lane_blocks
    if k <= 2048:  # the one-step tile as it was
        assert on == replace(off, lane_blocks=True)
    else:  # the longer rows' loop: steps of 1,024 (a whole block a lane at 8 rows and 8 warps)
        assert (on.block_n, on.block_k, on.num_warps, off.block_k) == (8, 1024, 8, 512)
    assert not env_tile(default, w, 1, int8_x=False).lane_blocks  # fp32 x: not this kernel's
    for m in (2, 4, 5):  # batched decode: the default tile in the lanes' layout, up to 4 rows
        rows = default_config(qtype, m, n, k)
        assert env_tile(rows, w, m, int8_x=True) == replace(rows, lane_blocks=m <= 4)
    monkeypatch.setenv("STRATA_INT8_LANE_BLOCKS", "2")
    with pytest.raises(ValueError, match="STRATA_INT8_LANE_BLOCKS"):
        env_tile(default, w, 1, int8_x=True)


def test_refused_configs():
    k = 256
    x = torch.randn(1, k, device=DEVICE).bfloat16()
    q5 = pack_quant_weight(random_weight(T.Q5_0, 8, k, 1).to(DEVICE), T.Q5_0, 8, k)
    with pytest.raises(ValueError, match="lane_blocks is a layout of the int8_x Q8_0 and Q5_0 kernels"):
        quant_matvec(x, q5, T.Q5_0, 8, k, config=replace(LANES, int8_x=False))
    with pytest.raises(ValueError, match="not 5 rows of Q5_0"):
        quant_matvec(x.expand(5, k), q5, T.Q5_0, 8, k, config=replace(LANES, matched_loads=False))
    q4 = pack_quant_weight(random_weight(T.Q4_K, 8, k, 1).to(DEVICE), T.Q4_K, 8, k, "planar")
    with pytest.raises(ValueError, match="rows of Q4_K"):
        quant_matvec(x, q4, T.Q4_K, 8, k, config=replace(LANES, matched_loads=False))


@cuda_only
@QTYPES
@pytest.mark.parametrize("n", [1152, 9728])
def test_model_shapes_cuda(qtype: T, n: int):
    # the 0.5B's q+k+v and gate+up at its decode tile (8 x 1,024, preloaded, 8 warps)
    check_int8(1, n, 896, torch.bfloat16, replace(LANES, block_k=1024, num_warps=8, preload=True), qtype)
