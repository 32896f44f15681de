"""`strata bench ab`: arm A against arm B, interleaved after warm-up, with a correctness gate.

Pairs run in ABBA order by default (A B, B A, A B, ...), so a linear drift hits both arms alike
within every two pairs. Files in the output folder: runs.json (every run, warm-ups included),
summary.json (ratios B/A and the gate), metadata.json (provenance), logs/ (each worker's stderr).
The exit status is 1 when the gate says the arms did not do the same work.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from . import stats
from .arms import ArmSpec
from .gate import gate
from .session import BenchConfig, Session, metric_names, write_json

ORDERS = ("abba", "abab")
GATES = ("auto", "identical", "self")
DIRECTION = "B/A of tokens per second: above 1 means arm B is faster"


@dataclass(frozen=True)
class ABConfig:
    bench: BenchConfig
    arm_a: ArmSpec
    arm_b: ArmSpec
    pairs: int = 5
    order: str = "abba"
    gate: str = "auto"

    def __post_init__(self) -> None:
        if self.pairs < 1:
            raise ValueError(f"pairs is {self.pairs}; it must be at least 1")
        if self.order not in ORDERS or self.gate not in GATES:
            raise ValueError(f"order {self.order!r} / gate {self.gate!r}: choose from {ORDERS} / {GATES}")

    @property
    def gate_mode(self) -> str:
        if self.gate != "auto":
            return self.gate
        return "identical" if self.arm_a.arithmetic == self.arm_b.arithmetic else "self"


def schedule(pairs: int, order: str) -> list[tuple[int, str]]:
    """(pair, arm) in run order."""
    runs = []
    for pair in range(pairs):
        first_b = order == "abba" and pair % 2 == 1
        runs += [(pair, "B"), (pair, "A")] if first_b else [(pair, "A"), (pair, "B")]
    return runs


def summarize(runs: list[dict[str, Any]], metrics: list[str], gate_mode: str) -> dict[str, Any]:
    timed = [r for r in runs if not r["warmup"]]
    a = sorted((r for r in timed if r["arm"] == "A"), key=lambda r: r["pair"])
    b = sorted((r for r in timed if r["arm"] == "B"), key=lambda r: r["pair"])
    summary: dict[str, Any] = {"direction": DIRECTION, "pairs": len(a), "metrics": {}}
    for name in metrics:
        ratios = stats.pair_ratios([r[name] for r in a], [r[name] for r in b])
        fit = stats.drift_fit(
            [r["index"] for r in timed], [r["arm"] == "B" for r in timed], [r[name] for r in timed]
        )
        summary["metrics"][name] = {
            "a_median": statistics.median(r[name] for r in a),
            "b_median": statistics.median(r[name] for r in b),
            "pair_ratios": ratios,
            "ratio": stats.ratio_summary(ratios),
            "drift_fit": fit.to_json() if fit is not None else None,
        }
    summary["drift_fit_note"] = (
        "log(tok/s) ~ run index + arm, least squares; arm_ratio is B/A with the linear drift removed; "
        "descriptive only (no confidence claim at this many runs); null under 4 runs"
    )
    return summary | gate(runs, gate_mode)


def run_ab(config: ABConfig) -> int:
    bench = config.bench
    with Session(bench, {"A": config.arm_a, "B": config.arm_b}) as session:
        for arm in ("A", "B"):
            for _ in range(bench.warmup):
                session.measure(arm, None, warmup=True)
        for pair, arm in schedule(config.pairs, config.order):
            session.measure(arm, pair)
        write_json(bench.out / "metadata.json", session.metadata() | {"ab": _describe(config)})
        summary = summarize(session.runs, metric_names(bench.workload), config.gate_mode)
    write_json(bench.out / "summary.json", summary)
    print(format_summary(summary, config))
    print(f"wrote {bench.out}/runs.json, summary.json, metadata.json")
    return 0 if summary["gate"] == "pass" else 1


def _describe(config: ABConfig) -> dict[str, Any]:
    return {
        "A": str(config.arm_a),
        "B": str(config.arm_b),
        "pairs": config.pairs,
        "order": config.order,
        "gate": config.gate_mode,
    }


def format_summary(summary: dict[str, Any], config: ABConfig) -> str:
    w = config.bench.workload
    lines = [
        f"A = {config.arm_a}   B = {config.arm_b}   ({config.order.upper()}, {summary['pairs']} pairs)",
        f"prompt {w.prompt_len}, depth {w.depth}, batch {w.batch}"
        + (f", {w.new_tokens} decoded" if w.mode == "decode" else ""),
        f"{'metric':<15}{'A tok/s':>10}{'B tok/s':>10}{'B/A median':>12}{'min':>8}{'max':>8}"
        f"{'drift-adj':>11}",
    ]
    for name, m in summary["metrics"].items():
        fit = m["drift_fit"]
        adjusted = f"{fit['arm_ratio']:.3f}" if fit else "-"
        r = m["ratio"]
        lines.append(
            f"{name:<15}{m['a_median']:>10.2f}{m['b_median']:>10.2f}{r['median']:>12.3f}"
            f"{r['min']:>8.3f}{r['max']:>8.3f}{adjusted:>11}"
        )
    agree = summary["agreement"]
    lines.append(
        f"gate ({summary['mode']}): {summary['gate']}"
        + (f", first difference {summary['first_difference']}" if summary["first_difference"] else "")
        + f"; A vs B common prefix {agree['common_prefix']}, equal {agree['equal_fraction']:.1%}"
    )
    return "\n".join(lines)
