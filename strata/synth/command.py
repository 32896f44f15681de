"""`strata synth`: list the built-in layouts, or write one (or a JSON layout) as a GGUF file."""

from __future__ import annotations

from pathlib import Path

from strata.synth.layouts import BUILTIN_LAYOUTS, Layout, load_layout, plan_tensors
from strata.synth.writer import write_layout


def describe(layout: Layout) -> str:
    plans = plan_tensors(layout)
    size = sum(p.nbytes for p in plans) / 1e9
    experts = f", {layout.num_experts} experts ({layout.num_experts_used} active)" if layout.is_moe else ""
    return (
        f"{layout.name:<20} {layout.architecture:<8} {layout.num_layers:>2} layers, hidden "
        f"{layout.hidden_size}{experts}, {len(plans)} tensors, {size:.2f} GB ({layout.recipe})"
    )


def synth_command(
    spec: str | None, out: Path | None, seed: int = 0, threads: int | None = None, list_only: bool = False
) -> None:
    """Print the built-in layouts, or write `spec` (a name or a JSON file) to `out` and report speed."""
    if list_only:
        for layout in BUILTIN_LAYOUTS.values():
            print(describe(layout))
        return
    if spec is None or out is None:
        raise ValueError("strata synth needs SPEC and OUT.gguf (or --list to see the built-in specs)")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads {threads}: give at least 1")
    layout = load_layout(spec)
    stats = write_layout(out, layout, seed=seed, threads=threads, progress=True)
    print(
        f"wrote {stats.path}: {stats.num_tensors} tensors, {stats.nbytes / 1e9:.3f} GB in "
        f"{stats.seconds:.2f} s ({stats.gb_per_s:.2f} GB/s)"
    )
