"""Q8_0's and Q5_0's dp4a matvec with matched loads (`_matvec_legacy_int8_matched`) and its preloaded
step: against the int8 path's own arithmetic and the fp32 product (`check_int8`), against the plain
int8 kernel (the same integer dot products, scaled per chunk instead of per block: fp32 rounding
apart), the preloaded step bit for bit against the matched loop, the tile a decode takes with
STRATA_INT8_X, and the configs refused."""

from __future__ import annotations

import os
from dataclasses import replace

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.kernels.matvec_tiles import env_tile  # noqa: E402
from strata.kernels.quant_matvec import MatvecConfig, auto_split_k, default_config, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import pack_quant_weight  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, check_int8, cuda_only, k_for, random_weight  # noqa: E402

QTYPES = pytest.mark.parametrize("qtype", [T.Q8_0, T.Q5_0], ids=lambda t: t.name)


def run(qtype: T, n: int, k: int, config: MatvecConfig, seed: int = 0) -> tuple[torch.Tensor, ...]:
    raw = random_weight(qtype, n, k, seed=seed)
    packed = pack_quant_weight(raw.to(DEVICE), qtype, n, k)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, k, generator=gen).bfloat16().to(DEVICE)
    x[0, 32:64] = 0  # an all-zero block: scale 0
    outs = []
    for cfg in (replace(config, matched_loads=False, preload=False), config):
        out = torch.full((1, n), float("nan"), dtype=torch.float32, device=DEVICE)
        outs.append(quant_matvec(x.float(), packed, qtype, n, k, out=out, config=cfg))
    return x, packed, *outs


@QTYPES
@pytest.mark.parametrize("n,blocks,split_k", [(37, 40, 1), (21, 7, 3), (64, 28, 2)])
def test_matched_against_reference(qtype: T, n: int, blocks: int, split_k: int):
    check_int8(
        1, n, k_for(qtype, blocks), torch.bfloat16, MatvecConfig(8, 256, split_k, matched_loads=True), qtype
    )


@QTYPES
def test_matched_against_the_plain_int8_kernel(qtype: T):
    # fp32 x so that the output keeps the sums' rounding: within a few ulps of the plain kernel's
    _, _, plain, matched = run(qtype, 37, 40 * 32, MatvecConfig(8, 256, 2, int8_x=True, matched_loads=True))
    assert torch.isfinite(matched).all()
    assert torch.allclose(matched, plain, rtol=1e-5, atol=1e-5 * plain.abs().max().item())


@QTYPES
@pytest.mark.parametrize("n,k", [(37, 896), (16, 2048)])
def test_preloaded_step_is_the_matched_loop_bit_for_bit(qtype: T, n: int, k: int):
    block_k = 1 << (k - 1).bit_length()
    matched = MatvecConfig(8, block_k, 1, 8, int8_x=True, matched_loads=True)
    x, packed, _, want = run(qtype, n, k, matched, seed=3)
    out = torch.full((1, n), float("nan"), dtype=torch.float32, device=DEVICE)
    got = quant_matvec(x.float(), packed, qtype, n, k, out=out, config=replace(matched, preload=True))
    assert torch.equal(got, want)


@QTYPES
@pytest.mark.parametrize(
    "n,k,tile", [(9728, 896, (8, 1024, 1, 8)), (65536, 896, (8, 1024, 1, 4)), (64, 4096, None)]
)
def test_decode_tile_with_int8_x(qtype: T, n: int, k: int, tile, monkeypatch):
    # int8 x (STRATA_INT8_X's types): the one-step tile, matched and preloaded (4 warps on an output
    # head's rows); K over 2,048: the matched loop at 8 x 512, 8 warps
    monkeypatch.delenv("STRATA_MATVEC_PRELOAD", raising=False)
    w = pack_quant_weight(random_weight(qtype, 64, 256, 0).to(DEVICE), qtype, 64, 256)
    w = replace(w, n=n, k=k)  # only the shape matters to the tile
    default = default_config(qtype, 1, n, k)
    cfg = env_tile(default, w, 1, int8_x=True)
    assert cfg.matched_loads and not cfg.flat_acc
    long_rows = (8, 512, auto_split_k(n, k, 8, 512), 8)
    assert (cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_warps) == (tile or long_rows)
    assert cfg.preload == (tile is not None)
    monkeypatch.setenv("STRATA_MATVEC_PRELOAD", "1")  # preload without matched loads: not this kernel's
    assert env_tile(default, w, 1, int8_x=True) == default


def test_refused_configs():
    k = 256
    packed = pack_quant_weight(random_weight(T.Q5_0, 8, k, 1).to(DEVICE), T.Q5_0, 8, k)
    x = torch.randn(2, k, device=DEVICE).bfloat16()
    with pytest.raises(ValueError, match="matched_loads is implemented for one row of x"):
        quant_matvec(x, packed, T.Q5_0, 8, k, config=MatvecConfig(8, 256, int8_x=True, matched_loads=True))
    with pytest.raises(ValueError, match="runs the matched or the lanes. step: give matched_loads=True"):
        quant_matvec(x[:1], packed, T.Q5_0, 8, k, config=MatvecConfig(8, 256, int8_x=True, preload=True))


@cuda_only
@QTYPES
@pytest.mark.parametrize("n", [1152, 9728])
def test_model_shapes_cuda(qtype: T, n: int):
    # the 0.5B's q+k+v and gate+up at its decode tile (8 x 1,024, preloaded, matched)
    check_int8(
        1, n, 896, torch.bfloat16, MatvecConfig(8, 1024, 1, 8, matched_loads=True, preload=True), qtype
    )
