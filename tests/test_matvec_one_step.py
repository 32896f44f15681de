"""STRATA_MATVEC_ONE_STEP: Q4_K's planar int8 matvec of one row with K of 2,049-4,096 (the 7B's q+k+v
and o) takes all of K in one preloaded 8 x 4,096 step. Its flat accumulator sums a row's products
over one step where the default tile (8 x 2,048, or 8 x 512 below 2,048 rows) adds the steps'
partial sums first: another order of fp32 additions, so the test bounds the difference (a few ulps of
the output's largest value) rather than asking for the same bits; a wrong tile is off by about the
output itself. Outside that K, and for
other layouts, types and batches, the setting changes nothing.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

import strata.kernels.int8_matvec as im  # noqa: E402
from strata.kernels.matvec_tiles import ONE_STEP_K  # noqa: E402
from strata.kernels.quant_matvec import quant_matvec  # noqa: E402
from tests.launch_recorder import LaunchRecorder  # noqa: E402
from tests.test_kernels_q4k_rows import layouts  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, k_for  # noqa: E402


def launches(monkeypatch, x, packed, steps: str) -> tuple[torch.Tensor, dict]:
    recorder = LaunchRecorder(im.q4_k_int8_matvec_kernel)
    monkeypatch.setattr(im, "q4_k_int8_matvec_kernel", recorder)
    monkeypatch.setenv("STRATA_MATVEC_ONE_STEP", steps)
    out = quant_matvec(x, packed, T.Q4_K, packed.n, packed.k)
    (launch,) = recorder.launches
    return out, launch


@pytest.mark.parametrize("blocks,n,warps", [(9, 40, "4"), (14, 19, "8"), (16, 8, "4")])
def test_one_step_is_within_ulps_of_the_default(monkeypatch, blocks: int, n: int, warps: str):
    # 9 super-blocks: K = 2,304, the step mostly masked; 14: the 7B's 3,584; 16: exactly 4,096.
    k = k_for(T.Q4_K, blocks)
    assert ONE_STEP_K[0] < k <= ONE_STEP_K[1]
    planar, _ = layouts(n, k, seed=blocks)
    x = torch.randn(1, k, device=DEVICE).bfloat16()
    want, default = launches(monkeypatch, x, planar, "0")
    got, one = launches(monkeypatch, x, planar, warps)
    # (the default tile at these few rows is 8 x 512; from 2,048 rows on, 8 x 2,048: two steps either way)
    assert default["BLOCK_K"] < k and not default["PRELOAD"]
    assert (one["BLOCK_K"], one["BLOCK_N"], one["SPLIT_K"], one["PRELOAD"]) == (4096, 8, 1, True)
    assert one["num_warps"] == int(warps)
    assert torch.isfinite(want).all() and torch.isfinite(got).all()
    # bf16 outputs: a different fp32 order may round to the neighbouring bf16 value.
    assert (got.float() - want.float()).abs().max() <= 4 * 2**-8 * want.float().abs().max()


@pytest.mark.parametrize("blocks,m,layout", [(8, 1, "planar"), (17, 1, "planar"), (14, 2, "planar"),
                                             (14, 1, "rows")])  # fmt: skip
def test_outside_its_shapes_nothing_changes(monkeypatch, blocks: int, m: int, layout: str):
    # K = 2,048 (one step already) and 4,352 (past the step), two x rows, the rows layout's own kernel.
    k = k_for(T.Q4_K, blocks)
    planar, rows = layouts(24, k, seed=blocks + m)
    packed = planar if layout == "planar" else rows
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    monkeypatch.setenv("STRATA_MATVEC_ONE_STEP", "0")
    want = quant_matvec(x, packed, T.Q4_K, packed.n, k)
    monkeypatch.setenv("STRATA_MATVEC_ONE_STEP", "8")
    assert torch.equal(quant_matvec(x, packed, T.Q4_K, packed.n, k), want)


def test_a_bad_value_names_the_setting(monkeypatch):
    planar, _ = layouts(8, k_for(T.Q4_K, 14), seed=3)
    x = torch.randn(1, planar.k, device=DEVICE).bfloat16()
    monkeypatch.setenv("STRATA_MATVEC_ONE_STEP", "16")
    with pytest.raises(ValueError, match="STRATA_MATVEC_ONE_STEP='16' must be 0, 4 or 8"):
        quant_matvec(x, planar, T.Q4_K, planar.n, planar.k)
