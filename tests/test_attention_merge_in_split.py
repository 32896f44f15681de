"""STRATA_ATTENTION_MERGE=split: the last split of each head group to finish merges the group's
partials (`_paged_attention_merge._merge_in_split`) instead of the merge kernel.

Held to the merge kernel's output on the same inputs (to a few ulps: it sums over splits in split
order, the kernel in a tree), to the float64 reference, and to what it must leave behind: no merge
launch where it merges, the merge kernel past `MERGE_IN_SPLIT_MAX` splits, and every split-K counter
back at zero.
"""

from __future__ import annotations

import functools
import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

import strata.kernels.paged_attention as pa  # noqa: E402
from strata.kernels.split_locks import split_locks  # noqa: E402
from tests.launch_recorder import LaunchRecorder  # noqa: E402
from tests.test_kernels_paged_attention import DEVICE, check, small_case  # noqa: E402


def assert_close_to_kernel(got: torch.Tensor, want: torch.Tensor) -> None:
    tol = 4 * torch.finfo(got.dtype).eps
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("prefetch", ["0", "tile"])
def test_merge_in_split_gives_the_merge_kernels_output(monkeypatch, window, prefetch):
    # In 16-position tiles a context of 1 position fills one split (its output written directly, no
    # counting), 17, 130 and 300 several (130 over 8 splits leaves live ones empty); 8 splits of a
    # tile or two, and 2 and 3 splits of several tiles each.
    merges = LaunchRecorder(pa._merge_kernel)
    monkeypatch.setattr(pa, "_merge_kernel", merges)
    monkeypatch.setenv("STRATA_ATTENTION_PREFETCH", prefetch)
    args = small_case([1, 17, 130, 300], seed=11)
    for num_splits in (8, 2, 3):
        run = functools.partial(
            pa.paged_decode_attention, *args, block_size=16, num_splits=num_splits, block_t=16, window=window
        )
        monkeypatch.delenv("STRATA_ATTENTION_MERGE", raising=False)
        want = run()
        monkeypatch.setenv("STRATA_ATTENTION_MERGE", "split")
        assert_close_to_kernel(run(), want)
    assert len(merges.launches) == 3  # the kernel's arm only
    assert not split_locks(torch.device(DEVICE), 1).any(), "a split-K counter left non-zero"


def test_merge_in_split_against_the_reference(monkeypatch):
    # Qwen2.5's 14 query heads over 2 KV heads, head_dim 24 (pads to 32), bf16, 16 splits of a tile.
    monkeypatch.setenv("STRATA_ATTENTION_MERGE", "split")
    check([17, 300, 2, 640], 14, 2, 24, 5, torch.bfloat16, 16)


def test_many_splits_keep_the_merge_kernel(monkeypatch):
    # Past MERGE_IN_SPLIT_MAX splits (the merge in the split kernel is unrolled over them) the merge
    # kernel runs; 16 splits (the short graphs') and 32 of 16-position tiles over 600 positions.
    assert pa.MERGE_IN_SPLIT_MAX == 16
    merges = LaunchRecorder(pa._merge_kernel)
    monkeypatch.setattr(pa, "_merge_kernel", merges)
    monkeypatch.setenv("STRATA_ATTENTION_MERGE", "split")
    args = small_case([600, 200], seed=12)
    run = functools.partial(pa.paged_decode_attention, *args, block_size=16, block_t=16)
    fused = run(num_splits=16)
    assert not merges.launches
    monkeypatch.delenv("STRATA_ATTENTION_MERGE")
    assert_close_to_kernel(fused, run(num_splits=16))
    monkeypatch.setenv("STRATA_ATTENTION_MERGE", "split")
    run(num_splits=32)
    assert len(merges.launches) == 2


def test_merge_setting_is_checked(monkeypatch):
    from strata import env

    monkeypatch.setenv("STRATA_ATTENTION_MERGE", "1")
    with pytest.raises(
        ValueError, match="STRATA_ATTENTION_MERGE='1' must be kernel or split; unset it for kernel"
    ):
        env.attention_merge()
