"""Descriptive statistics of paired runs: per-pair ratios and a drift-adjusted arm ratio.

With a handful of pairs there is no honest confidence interval, so none is given: the median pair
ratio, its range, and a least-squares fit that removes a linear drift over the run order.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


def pair_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """b[i] / a[i] for each pair i."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need equal, non-zero numbers of A and B values, got {len(a)} and {len(b)}")
    return [y / x for x, y in zip(a, b, strict=True)]


def ratio_summary(ratios: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


@dataclass(frozen=True)
class DriftFit:
    """log(value) = log_intercept + log_drift * run_index + log_arm * is_b, by ordinary least squares.

    `arm_ratio` = exp(log_arm): B over A at the same moment; `drift_per_run` = exp(log_drift) - 1:
    the relative change of both arms from one run to the next. Residuals are in log units.
    """

    arm_ratio: float
    drift_per_run: float
    log_intercept: float
    log_residuals: list[float]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def drift_fit(run_index: Sequence[int], is_b: Sequence[bool], values: Sequence[float]) -> DriftFit | None:
    """The fit above; None when there are too few runs to separate drift from the arm (under 4)."""
    if not len(run_index) == len(is_b) == len(values):
        raise ValueError(f"lengths differ: {len(run_index)} indices, {len(is_b)} arms, {len(values)} values")
    if len(values) < 4 or all(is_b) or not any(is_b):
        return None
    x = np.column_stack([np.ones(len(values)), np.asarray(run_index, float), np.asarray(is_b, float)])
    y = np.log(np.asarray(values, float))
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    residuals = y - x @ coef
    return DriftFit(
        arm_ratio=float(np.exp(coef[2])),
        drift_per_run=float(np.expm1(coef[1])),
        log_intercept=float(coef[0]),
        log_residuals=[float(r) for r in residuals],
    )
