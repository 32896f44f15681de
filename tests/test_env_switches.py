"""The on/off and integer settings of strata.env: each one's default, its values (0 and 1; the least
and the most), and the error a careful server gives for anything else (naming the variable, the
choices or bounds, and the default)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from strata import env

SWITCHES: list[tuple[str, Callable[[], bool], bool]] = [
    ("STRATA_ACT_IN_QUANT", env.act_in_quant, True),
    ("STRATA_QUANT_IN_NORM", env.quant_in_norm, True),
    ("STRATA_LIVE_SPLITS", env.live_splits, False),
    ("STRATA_ROPE_IN_MATVEC", env.rope_in_matvec, True),
    ("STRATA_CONCURRENT_PROJECTIONS", env.concurrent_projections, True),
    ("STRATA_DENSE_STACK", env.dense_stack, True),
    ("STRATA_WIDEN_TO_STACK", env.widen_to_stack, False),
    ("STRATA_ROWS_PRELOAD", env.rows_preload, False),
    ("STRATA_INT8_LANE_BLOCKS", env.int8_lane_blocks, False),
    ("STRATA_SPLIT_ONE_STEP", env.split_one_step, False),
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


INTEGERS: list[tuple[str, Callable[[], int], int, int, int]] = [
    ("STRATA_MERGE_WARPS", env.merge_warps, 0, 0, 16),
    ("STRATA_Q6K_HALVES", env.q6k_halves, 0, 0, 64),
]


@pytest.mark.parametrize("name,read,default,least,most", INTEGERS, ids=[s[0] for s in INTEGERS])
def test_integer_setting(
    monkeypatch, name: str, read: Callable[[], int], default: int, least: int, most: int
):
    monkeypatch.delenv(name, raising=False)
    assert read() == default
    for value in (least, most):
        monkeypatch.setenv(name, str(value))
        assert read() == value
    monkeypatch.setenv(name, str(most + 1))
    message = f"{name}='{most + 1}' must be an integer from {least} to {most}; unset it for {default}"
    with pytest.raises(ValueError, match=message):
        read()


def test_merge_warps_are_a_power_of_two(monkeypatch):
    monkeypatch.setenv("STRATA_MERGE_WARPS", "3")
    with pytest.raises(
        ValueError, match="STRATA_MERGE_WARPS=3 must be a power of two .1, 2, 4, 8 or 16. or 0"
    ):
        env.merge_warps()
