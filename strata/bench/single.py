"""`strata bench decode` and `strata bench prefill`: one arm, repeated runs, tok/s medians."""

from __future__ import annotations

import statistics
from typing import Any

from .arms import ArmSpec
from .gate import first_difference
from .session import BenchConfig, Session, metric_names, write_json


def run_single(bench: BenchConfig, spec: ArmSpec, repeats: int) -> int:
    """Exit status 1 when a run's greedy ids differ from the first run's (the arm is not repeatable)."""
    if repeats < 1:
        raise ValueError(f"repeats is {repeats}; it must be at least 1")
    with Session(bench, {"A": spec}) as session:
        for _ in range(bench.warmup):
            session.measure("A", None, warmup=True)
        for i in range(repeats):
            session.measure("A", i)
        write_json(bench.out / "metadata.json", session.metadata())
        runs = session.runs
    timed = [r for r in runs if not r["warmup"]]
    summary: dict[str, Any] = {"arm": str(spec), "runs": len(timed), "metrics": {}}
    for name in metric_names(bench.workload):
        values = [r[name] for r in timed]
        summary["metrics"][name] = {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
        }
    diffs = [(r["index"], d) for r in runs if (d := first_difference(runs[0]["tokens"], r["tokens"]))]
    summary["repeatable"] = not diffs
    summary["first_difference"] = {"run": diffs[0][0], "sequence_position": diffs[0][1]} if diffs else None
    write_json(bench.out / "summary.json", summary)
    w = bench.workload
    print(f"{spec}: prompt {w.prompt_len}, depth {w.depth}, batch {w.batch}, {len(timed)} runs")
    for name, m in summary["metrics"].items():
        print(f"  {name:<15} median {m['median']:10.2f}   min {m['min']:10.2f}   max {m['max']:10.2f}")
    print(f"  same greedy ids every run: {'yes' if not diffs else 'NO, ' + str(summary['first_difference'])}")
    print(f"wrote {bench.out}/runs.json, summary.json, metadata.json")
    return 0 if not diffs else 1
