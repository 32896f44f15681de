"""The correctness gate: timing means nothing unless both arms did the same work.

`identical` (arms with the same arithmetic): every run of both arms emits the same greedy ids as
arm A's first run. `self` (a peer, whose arithmetic differs): each arm repeats its own first run's
ids exactly; how far the arms agree with each other is reported, not judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Tokens = list[list[int]]  # per sequence


def first_difference(expected: Tokens, got: Tokens) -> tuple[int, int] | None:
    """(sequence, position) of the first differing id, None when equal (a length difference counts)."""
    for seq, (e, g) in enumerate(zip(expected, got, strict=True)):
        for pos in range(max(len(e), len(g))):
            if pos >= len(e) or pos >= len(g) or e[pos] != g[pos]:
                return seq, pos
    return None


def agreement(a: Tokens, b: Tokens) -> dict[str, Any]:
    """Common prefix length per sequence and the fraction of positions with equal ids."""
    prefixes, equal, total = [], 0, 0
    for x, y in zip(a, b, strict=True):
        prefix = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
        prefixes.append(prefix)
        equal += sum(p == q for p, q in zip(x, y, strict=False))
        total += max(len(x), len(y))
    return {"common_prefix": prefixes, "equal_fraction": equal / total if total else 1.0}


def _check(runs: Sequence[dict[str, Any]], reference: dict[str, Any]) -> dict[str, Any] | None:
    for run in runs:
        diff = first_difference(reference["tokens"], run["tokens"])
        if diff is not None:
            seq, pos = diff
            ref, got = reference["tokens"][seq], run["tokens"][seq]
            return {
                "run": run["index"],
                "arm": run["arm"],
                "reference_run": reference["index"],
                "sequence": seq,
                "position": pos,
                "expected": ref[pos] if pos < len(ref) else None,
                "got": got[pos] if pos < len(got) else None,
            }
    return None


def gate(runs: Sequence[dict[str, Any]], mode: str) -> dict[str, Any]:
    """{"gate": "pass" | "invalid", "mode", "first_difference" | None, "agreement"} over all runs."""
    by_arm = {arm: [r for r in runs if r["arm"] == arm] for arm in ("A", "B")}
    if mode == "identical":
        diff = _check(runs, by_arm["A"][0])
    elif mode == "self":
        diff = _check(by_arm["A"], by_arm["A"][0]) or _check(by_arm["B"], by_arm["B"][0])
    else:
        raise ValueError(f"gate mode {mode!r} is not identical or self")
    return {
        "gate": "pass" if diff is None else "invalid",
        "mode": mode,
        "first_difference": diff,
        "agreement": agreement(by_arm["A"][0]["tokens"], by_arm["B"][0]["tokens"]),
    }
