"""A stand-in for a Triton kernel that records each launch's keyword arguments, then launches the
kernel: for options whose outputs are the same bits as without them, only the record shows that the
launcher passed them on."""

from __future__ import annotations

from typing import Any


class LaunchRecorder:
    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.launches: list[dict[str, Any]] = []
        self.grids: list[Any] = []

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Any:
            self.launches.append(kwargs)
            self.grids.append(grid)
            return self.kernel[grid](*args, **kwargs)

        return launch
