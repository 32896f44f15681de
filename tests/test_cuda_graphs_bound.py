"""Which bound decode attention splits a step's contexts by (`cuda_graphs.context_bound`): the same
rule picks the captured graph set and the eager path's bound, so the two agree."""

from __future__ import annotations

import pytest

from strata import env
from strata.engine.cuda_graphs import context_bound


@pytest.mark.parametrize(
    "max_context,short,expected",
    [(1, 0, 2048), (100, 256, 256), (256, 256, 256), (257, 256, 2048), (10, 2048, 2048), (10, 4096, 2048)],
)
def test_context_bound(max_context: int, short: int, expected: int):
    # Off (0), within the short bound, one past it, and a short bound not below the longest context.
    assert context_bound(max_context, 2048, short) == expected


def test_setting(monkeypatch):
    monkeypatch.delenv("STRATA_SHORT_GRAPHS", raising=False)
    assert env.short_graphs() == 0
    monkeypatch.setenv("STRATA_SHORT_GRAPHS", "256")
    assert env.short_graphs() == 256
    monkeypatch.setenv("STRATA_SHORT_GRAPHS", "-1")
    with pytest.raises(ValueError, match="STRATA_SHORT_GRAPHS='-1' must be an integer of at least 0"):
        env.short_graphs()
