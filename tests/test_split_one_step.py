"""STRATA_SPLIT_ONE_STEP (`matvec_tiles.splits_to_one_step`): which one-row int8 matvecs it splits to
one preloaded step a program (Q4_K planar and Q6_K blocks on weights of few row tiles, as the 0.5B's
Q4_K down) and which it leaves alone, and the products of the split tile against the default's and
the int8 reference."""

from __future__ import annotations

import os
from dataclasses import replace

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.kernels.matvec_checks import program_steps  # noqa: E402
from strata.kernels.matvec_tiles import env_tile  # noqa: E402
from strata.kernels.quant_matvec import default_config, quant_matvec  # noqa: E402
from strata.kernels.quant_pack import pack_quant_weight  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, check_int8, k_for, random_weight  # noqa: E402


def packed(qtype: T, n: int, k: int, layout: str = "planar"):
    """A packed weight of that shape (only the shape matters to the tile)."""
    return replace(pack(random_weight(qtype, 64, 256, 0), qtype, 64, 256, layout), n=n, k=k)


def pack(raw: torch.Tensor, qtype: T, n: int, k: int, layout: str):
    """`layout` as Q4_K's (planar, rows) or Q6_K's (blocks, rows) layout."""
    if qtype == T.Q6_K:
        return pack_quant_weight(raw.to(DEVICE), qtype, n, k, q6k_layout=layout)
    return pack_quant_weight(raw.to(DEVICE), qtype, n, k, layout)


def tiles(qtype: T, n: int, k: int, monkeypatch, layout: str = "planar"):
    w = packed(qtype, n, k, layout)
    default = default_config(qtype, 1, n, k, planar_int8=w.planar)
    monkeypatch.delenv("STRATA_SPLIT_ONE_STEP", raising=False)
    off = env_tile(default, w, 1, int8_x=True)
    monkeypatch.setenv("STRATA_SPLIT_ONE_STEP", "1")
    return off, env_tile(default, w, 1, int8_x=True), w


@pytest.mark.parametrize("qtype,n,k", [(T.Q4_K, 896, 4864), (T.Q6_K, 896, 4864), (T.Q4_K, 1536, 8960)])
def test_short_weights_take_one_step_a_split(qtype: T, n: int, k: int, monkeypatch):
    # the 0.5B's Q4_K down (8 x 512 split 3 by default, four steps a program), its shape in Q6_K's
    # blocks layout, and the 1.5B's down's shape in Q4_K's planar layout (its default is "rows")
    off, on, _ = tiles(qtype, n, k, monkeypatch, "planar" if qtype == T.Q4_K else "blocks")
    assert program_steps(off, k) > 1 and not off.preload
    assert on == replace(off, split_k=-(-k // off.block_k), preload=True)
    assert program_steps(on, k) == 1


@pytest.mark.parametrize(
    "qtype,n,k,layout",
    [(T.Q4_K, 3584, 18944, "planar"), (T.Q4_K, 2048, 1536, "planar"), (T.Q4_K, 896, 4864, "rows"),
     (T.Q6_K, 896, 4864, "rows"), (T.Q5_0, 896, 4864, "blocks")],
)  # fmt: skip
def test_left_alone(qtype: T, n: int, k: int, layout: str, monkeypatch):
    # tall weights (the 7B's down: 448 tiles), one step already (the 1.5B's q+k+v), the rows layout's
    # own kernels (Q4_K's and Q6_K's), the Q5_0 dp4a kernel's tiles
    off, on, _ = tiles(qtype, n, k, monkeypatch, layout)
    assert on == off
    monkeypatch.setenv("STRATA_SPLIT_ONE_STEP", "yes")
    with pytest.raises(ValueError, match="STRATA_SPLIT_ONE_STEP"):
        env_tile(off, packed(qtype, n, k, layout), 1, int8_x=True)


@pytest.mark.parametrize("qtype,layout", [(T.Q4_K, "planar"), (T.Q6_K, "blocks")])
def test_products(qtype: T, layout: str, monkeypatch):
    n, k = 37, k_for(qtype, 9)  # 9 super-blocks: several steps of the default tile
    w = pack(random_weight(qtype, n, k, seed=5), qtype, n, k, layout)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(5)).bfloat16().to(DEVICE)
    outs = []  # the launch's own tile (no config), bf16 x: int8 by default
    for value in ("0", "1"):
        monkeypatch.setenv("STRATA_SPLIT_ONE_STEP", value)
        outs.append(quant_matvec(x, w, qtype, n, k).float())
    # the same int8 products split another way: fp32 order apart, then one bf16 rounding each
    assert torch.allclose(outs[1], outs[0], rtol=2**-7, atol=2**-7 * outs[0].abs().max().item())
    off, on, _ = tiles(qtype, n, k, monkeypatch, layout)
    assert on.split_k > off.split_k and on.preload
    check_int8(1, n, k, torch.bfloat16, on, qtype)
