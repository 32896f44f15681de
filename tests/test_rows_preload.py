"""STRATA_ROWS_PRELOAD: the row-interleaved int8 matvecs (Q4_K's and Q6_K's) load their first step's
weights before the PDL wait (`RowsConfig.preload`, `Q6KRowsConfig.preload`). The same sums in the same
order as without it, so the same bits: one and several x rows, splits that leave a split empty (its
preload masked to nothing, or unused), steps that do and do not cover K evenly, a lane on part of a
super-block, Q6_K with and without its prefetch; and the setting reaching both launches.
"""

from __future__ import annotations

import dataclasses
import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

import strata.kernels._matvec_q4k_rows as rows_kernel  # noqa: E402
import strata.kernels._matvec_q6k_rows as q6k_kernel  # noqa: E402
from strata.kernels._matvec_q4k_rows import RowsConfig, q4_k_rows_int8_matvec  # noqa: E402
from strata.kernels._matvec_q6k_rows import Q6KRowsConfig, q6_k_rows_int8_matvec  # noqa: E402
from strata.kernels.int8_inputs import quantize_x, use_asm  # noqa: E402
from strata.kernels.quant_matvec import quant_matvec  # noqa: E402
from tests.launch_recorder import LaunchRecorder  # noqa: E402
from tests.test_kernels_q4k_rows import layouts  # noqa: E402
from tests.test_kernels_q6k_rows import layouts as q6k_layouts  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, k_for  # noqa: E402


def rows_matvec(x: torch.Tensor, planes, n: int, k: int, cfg: RowsConfig) -> torch.Tensor:
    m = x.shape[0]
    out = torch.full((m, n), float("nan"), dtype=x.dtype, device=DEVICE)
    workspace = (
        torch.zeros(cfg.split_k, m, n, device=DEVICE),
        torch.zeros(-(-n // cfg.rows), dtype=torch.int32, device=DEVICE),
    )
    return q4_k_rows_int8_matvec(
        *quantize_x(x, planar=True), planes, n, k, out, cfg, use_asm=use_asm(x),
        workspace=workspace if cfg.split_k > 1 else None,
    )  # fmt: skip


@pytest.mark.parametrize(
    "m,blocks,step,split,subs",
    [
        (1, 3, 1, 1, 8),  # three steps, the first preloaded
        (1, 3, 1, 4, 8),  # a super-block a split, the fourth split empty
        (3, 5, 2, 2, 8),  # three x rows; a step past K's end (masked)
        (1, 2, 1, 8, 2),  # quarter super-blocks a lane, one unit a split
        (2, 3, 2, 1, 4),  # half super-blocks, steps of two over six units
    ],
)
def test_preload_gives_the_same_bits(m: int, blocks: int, step: int, split: int, subs: int):
    n, k = 70, k_for(T.Q4_K, blocks)
    _, packed = layouts(n, k, seed=blocks * 7 + split)
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    cfg = RowsConfig(packed.rows_group, step, split, packed.rows_group // 32 * step, subs=subs)
    want = rows_matvec(x, packed.planes, n, k, cfg)
    assert torch.isfinite(want).all()
    assert torch.equal(rows_matvec(x, packed.planes, n, k, dataclasses.replace(cfg, preload=True)), want)


def test_preload_and_prefetch_are_exclusive():
    n, k = 64, k_for(T.Q4_K, 2)
    _, packed = layouts(n, k, seed=1)
    x = torch.randn(1, k, device=DEVICE).bfloat16()
    with pytest.raises(ValueError, match="preload and prefetch are exclusive"):
        rows_matvec(x, packed.planes, n, k, RowsConfig(prefetch=True, preload=True))


@pytest.mark.parametrize(
    "m,blocks,split,prefetch",
    [(1, 2, 1, False), (1, 2, 1, True), (2, 3, 2, False), (1, 1, 4, False), (3, 2, 2, True)],
)
def test_q6k_preload_gives_the_same_bits(m: int, blocks: int, split: int, prefetch: bool):
    # Halves of super-blocks a step: 1 block over 4 splits leaves two empty (their preload unused).
    n, k = 70, k_for(T.Q6_K, blocks)
    _, packed = q6k_layouts(n, k, seed=blocks + split)
    x = torch.randn(m, k, device=DEVICE).bfloat16()
    xq, xd, _ = quantize_x(x, planar=False)

    def run(preload: bool) -> torch.Tensor:
        out = torch.full((m, n), float("nan"), dtype=x.dtype, device=DEVICE)
        workspace = (
            torch.zeros(split, m, n, device=DEVICE),
            torch.zeros(-(-n // packed.rows_group), dtype=torch.int32, device=DEVICE),
        )
        cfg = Q6KRowsConfig(packed.rows_group, split, prefetch, preload)
        return q6_k_rows_int8_matvec(
            xq,
            xd,
            packed.planes,
            n,
            k,
            out,
            cfg,
            use_asm=use_asm(x),
            workspace=workspace if split > 1 else None,
        )

    want = run(False)
    assert torch.isfinite(want).all()
    assert torch.equal(run(True), want)


@pytest.mark.parametrize("qtype,module,kernel", [
    (T.Q4_K, rows_kernel, "q4_k_rows_int8_matvec_kernel"),
    (T.Q6_K, q6k_kernel, "q6_k_rows_int8_matvec_kernel"),
])  # fmt: skip
def test_setting_reaches_the_launch(monkeypatch, qtype, module, kernel):
    # quant_matvec on an int8 x over the rows layouts: STRATA_ROWS_PRELOAD=1 launches with PRELOAD, the
    # default without; the same bits.
    recorder = LaunchRecorder(getattr(module, kernel))
    monkeypatch.setattr(module, kernel, recorder)
    n, k = 70, k_for(qtype, 3)
    _, packed = (layouts if qtype == T.Q4_K else q6k_layouts)(n, k, seed=5)
    x = torch.randn(1, k, device=DEVICE).bfloat16()
    monkeypatch.delenv("STRATA_ROWS_PRELOAD", raising=False)
    want = quant_matvec(x, packed, qtype, n, k)
    monkeypatch.setenv("STRATA_ROWS_PRELOAD", "1")
    assert torch.equal(quant_matvec(x, packed, qtype, n, k), want)
    assert [launch["PRELOAD"] for launch in recorder.launches] == [False, True]


def test_q6k_halves_reach_the_launch(monkeypatch):
    # STRATA_Q6K_HALVES on quant_matvec's rows path. 6 halves, one row group: the default rule splits
    # 8 ways, one half each and 2 splits empty; 1 half a split gives 6 splits of the same halves, the
    # same sums (an empty split adds zeros); 2 give 3, summed in another order.
    recorder = LaunchRecorder(q6k_kernel.q6_k_rows_int8_matvec_kernel)
    monkeypatch.setattr(q6k_kernel, "q6_k_rows_int8_matvec_kernel", recorder)
    n, k = 40, k_for(T.Q6_K, 3)
    _, packed = q6k_layouts(n, k, seed=7)
    x = torch.randn(1, k, device=DEVICE).bfloat16()
    monkeypatch.delenv("STRATA_Q6K_HALVES", raising=False)
    want = quant_matvec(x, packed, T.Q6_K, n, k)
    monkeypatch.setenv("STRATA_Q6K_HALVES", "1")
    assert torch.equal(quant_matvec(x, packed, T.Q6_K, n, k), want)
    monkeypatch.setenv("STRATA_Q6K_HALVES", "2")
    got = quant_matvec(x, packed, T.Q6_K, n, k)
    torch.testing.assert_close(got, want, rtol=2 * torch.finfo(torch.bfloat16).eps, atol=1e-3)
    assert [grid[1] for grid in recorder.grids] == [8, 6, 3]
