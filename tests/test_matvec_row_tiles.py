"""MatvecConfig.row_tiles: a program of Q5_0's preloaded matched matvec computes several consecutive row
tiles, loading the next tile's weights before multiplying the current. Each tile's operations are a
one-tile program's, so the outputs must equal row_tiles=1 bit for bit (plain, normed, with bias and
accumulated; rows no multiple of the tiles, a program's last tiles past the last row), the launch must
carry it (grid and constexpr), and the configs the kernel does not implement are refused by name."""

from __future__ import annotations

import os
from dataclasses import replace

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.kernels import matvec_tiles  # noqa: E402
from strata.kernels import quant_matvec as qm  # noqa: E402
from strata.kernels.quant_matvec import MatvecConfig, quant_matvec  # noqa: E402
from tests.fp32_x import fp32_x_q8_0_and_q5_0  # noqa: E402, F401 - autouse: Q8_0, Q5_0 on 16-bit x
from tests.launch_recorder import LaunchRecorder  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, check  # noqa: E402
from tests.test_matvec_preload import weight  # noqa: E402

ONE_TILE = MatvecConfig(8, 256, 1, num_warps=2, matched_loads=True, preload=True)


@pytest.mark.parametrize("n,row_tiles", [(21, 2), (21, 3), (40, 4), (5, 3)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_row_tiles_are_bitwise_one_tile(n: int, row_tiles: int, dtype: torch.dtype):
    # 21 rows at 3 tiles a program: one program of 24 rows; at 2: 16 + 8 (the second's last tile
    # 3 rows of 8). 5 rows at 3: two of the program's tiles lie wholly past the last row.
    k = 7 * 32
    packed = weight(T.Q5_0, n, k)
    x = torch.randn(1, k, device=DEVICE).to(dtype)
    bias = torch.randn(n, device=DEVICE)
    norm = (torch.randn(k, device=DEVICE).to(dtype), 1e-6)
    tiles = replace(ONE_TILE, row_tiles=row_tiles)
    for kwargs in ({}, {"bias": bias}, {"norm": norm}):
        want = quant_matvec(x, packed, T.Q5_0, n, k, config=ONE_TILE, **kwargs)
        out = torch.full((1, n + 3), float("nan"), dtype=dtype, device=DEVICE)
        got = quant_matvec(x, packed, T.Q5_0, n, k, out=out[:, :n], config=tiles, **kwargs)
        assert torch.equal(got, want), kwargs
        assert out[:, n:].isnan().all(), "a tile past the last row was stored"
    residual = torch.randn(1, n, device=DEVICE).to(dtype)
    want = quant_matvec(x, packed, T.Q5_0, n, k, out=residual.clone(), config=ONE_TILE, accumulate=True)
    got = quant_matvec(x, packed, T.Q5_0, n, k, out=residual.clone(), config=tiles, accumulate=True)
    assert torch.equal(got, want)


def test_row_tiles_match_reference():
    check(T.Q5_0, 1, 37, 7 * 32, torch.float32, replace(ONE_TILE, row_tiles=3))


def test_env_row_tiles_reach_the_kernel(monkeypatch: pytest.MonkeyPatch):
    # A launch without a config: STRATA_MATVEC_ROW_TILES gives tall weights (here from 3 tiles of 8
    # rows) that many tiles a program, in the constexpr and the grid; shorter weights keep one.
    kernel, unit = qm._KERNELS[T.Q5_0]
    recorder = LaunchRecorder(kernel)
    monkeypatch.setitem(qm._KERNELS, T.Q5_0, (recorder, unit))
    monkeypatch.setattr(matvec_tiles, "ROW_TILES_FROM", 3)
    monkeypatch.setenv("STRATA_MATVEC_ROW_TILES", "2")
    k = 7 * 32
    tall, short = weight(T.Q5_0, 40, k), weight(T.Q5_0, 16, k)
    x = torch.randn(1, k, device=DEVICE)
    got = quant_matvec(x, tall, T.Q5_0, 40, k)
    quant_matvec(x, short, T.Q5_0, 16, k)
    monkeypatch.delenv("STRATA_MATVEC_ROW_TILES")
    assert torch.equal(got, quant_matvec(x, tall, T.Q5_0, 40, k))
    launches = zip(recorder.launches, recorder.grids, strict=True)
    seen = [(s.get("ROW_TILES", 1), grid[0]) for s, grid in launches]
    assert seen == [(2, 3), (1, 2), (1, 5)]


def test_row_tiles_refuse_what_they_do_not_implement():
    k = 8 * 32
    x = torch.randn(1, k, device=DEVICE)
    for qtype, cfg in (
        (T.Q8_0, replace(ONE_TILE, row_tiles=2)),
        (T.Q5_0, replace(ONE_TILE, row_tiles=2, matched_loads=False)),
        (T.Q5_0, MatvecConfig(8, 128, 2, row_tiles=2)),
    ):
        with pytest.raises(ValueError, match=r"row_tiles=2 is implemented in Q5_0's preloaded matched step"):
            quant_matvec(x, weight(qtype, 21, k), qtype, 21, k, config=cfg)
    with pytest.raises(ValueError, match="split_k and row_tiles must be >= 1"):
        MatvecConfig(8, 256, row_tiles=0)
