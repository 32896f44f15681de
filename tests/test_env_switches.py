"""The on/off settings of strata.env (STRATA_* = 0 or 1): each one's default, both values, and the
error a careful server gives for anything else (naming the variable, the choices and the default)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from strata import env

SWITCHES: list[tuple[str, Callable[[], bool], bool]] = [
    ("STRATA_ACT_IN_QUANT", env.act_in_quant, True),
    ("STRATA_QUANT_IN_NORM", env.quant_in_norm, True),
    ("STRATA_LIVE_SPLITS", env.live_splits, False),
    ("STRATA_ROPE_IN_ATTENTION", env.rope_in_attention, False),
    ("STRATA_CONCURRENT_PROJECTIONS", env.concurrent_projections, True),
    ("STRATA_DENSE_STACK", env.dense_stack, True),
    ("STRATA_NORM_IN_MATVEC", env.norm_in_matvec, False),
    ("STRATA_WIDEN_TO_STACK", env.widen_to_stack, False),
    ("STRATA_X_PER_ROW", env.x_per_row, False),
]


@pytest.mark.parametrize("name,read,default", SWITCHES, ids=[s[0] for s in SWITCHES])
def test_switch(monkeypatch, name: str, read: Callable[[], bool], default: bool):
    monkeypatch.delenv(name, raising=False)
    assert read() is default
    monkeypatch.setenv(name, "")  # empty counts as unset
    assert read() is default
    for value, expected in (("0", False), ("1", True)):
        monkeypatch.setenv(name, value)
        assert read() is expected
    monkeypatch.setenv(name, "yes")
    with pytest.raises(ValueError, match=f"{name}='yes' must be 0 or 1; unset it for {int(default)}"):
        read()
