"""Which decode graphs and attention launch a step takes (`cuda_graphs.ShortGraphs`, `paged_decode`):
the same rule picks the captured graph set and the eager path's launch, so the two agree."""

from __future__ import annotations

import pytest
import torch

from strata import env
from strata.engine.cuda_graphs import ShortGraphs, paged_decode


@pytest.mark.parametrize(
    "max_context,positions,expected",
    [
        (1, 0, False),
        (100, 256, True),
        (256, 256, True),
        (257, 256, False),
        (10, 2048, False),
        (10, 4096, False),
    ],
)
def test_short_set_serves(max_context: int, positions: int, expected: bool):
    # Off (0), within the short bound, one past it, and a short bound not below the longest context.
    assert ShortGraphs(positions).serves(max_context, 2048) == expected


def test_launch_of_each_set():
    tables, lens = torch.zeros(2, 4, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    short = ShortGraphs(256, splits=16, block_t=64, stages=2)
    long = paged_decode(tables, lens, 16, 2048, short, is_short=False)
    fields = ("max_context_len", "num_splits", "max_splits", "block_t", "num_stages")

    def launch(paged):
        return tuple(getattr(paged, name) for name in fields)

    assert launch(long) == (2048, None, 0, 0, 0)
    # A cap on the splits: counted for the long set's bound, at most 16.
    assert launch(paged_decode(tables, lens, 16, 2048, short, is_short=True)) == (2048, None, 16, 64, 2)
    # No cap: split for the short bound.
    chosen = paged_decode(tables, lens, 16, 2048, ShortGraphs(256), is_short=True)
    assert launch(chosen) == (256, None, 0, 0, 0)


def test_settings(monkeypatch):
    for name in ("STRATA_SHORT_GRAPHS", "STRATA_SHORT_SPLITS", "STRATA_SHORT_BLOCK_T", "STRATA_SHORT_STAGES"):
        monkeypatch.delenv(name, raising=False)
    assert ShortGraphs.from_env() == ShortGraphs(2048, 16, 64, 2)  # the defaults (timed, 2026-12-07)
    monkeypatch.setenv("STRATA_SHORT_GRAPHS", "0")
    assert ShortGraphs.from_env() == ShortGraphs(0, 16, 64, 2)  # off: no short set
    monkeypatch.setenv("STRATA_SHORT_GRAPHS", "1024")
    monkeypatch.setenv("STRATA_SHORT_SPLITS", "8")
    monkeypatch.setenv("STRATA_SHORT_BLOCK_T", "32")
    monkeypatch.setenv("STRATA_SHORT_STAGES", "0")
    assert ShortGraphs.from_env() == ShortGraphs(1024, 8, 32, 0)
    monkeypatch.setenv("STRATA_SHORT_GRAPHS", "-1")
    with pytest.raises(ValueError, match="STRATA_SHORT_GRAPHS='-1' must be an integer of at least 0"):
        env.short_graphs()
    monkeypatch.setenv("STRATA_SHORT_BLOCK_T", "512")
    with pytest.raises(ValueError, match="STRATA_SHORT_BLOCK_T='512' must be an integer from 0 to 256"):
        env.short_attention()
    for bad in ("8", "48"):
        monkeypatch.setenv("STRATA_SHORT_BLOCK_T", bad)
        with pytest.raises(ValueError, match=f"STRATA_SHORT_BLOCK_T={bad} must be 0 or a power of two"):
            env.short_attention()
