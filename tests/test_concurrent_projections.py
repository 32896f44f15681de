"""STRATA_CONCURRENT_PROJECTIONS on the CPU: the path it leaves alone there (side streams are a GPU's;
test_model_kernel_path runs the streams on one; the setting itself is in test_env_switches)."""

from __future__ import annotations

import torch

from strata.layers import linear


def test_cpu_tensors_take_the_sequential_path(monkeypatch):
    # A Projections built to run side by side still runs its parts in order on CPU tensors.
    class Part(torch.nn.Module):
        def __init__(self, scale: float) -> None:
            super().__init__()
            self.scale = scale

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale

    proj = linear.Projections.__new__(linear.Projections)
    torch.nn.Module.__init__(proj)
    proj.parts = torch.nn.ModuleDict({"attn_q+attn_k": Part(2.0), "attn_v": Part(3.0)})
    proj.sizes = [[2, 2], [4]]
    proj.concurrent, proj.matvec_rows, proj.stacked = True, 4, None

    def never(*_):
        raise AssertionError("side streams on CPU tensors")

    monkeypatch.setattr(linear, "_side_by_side", never)
    x = torch.arange(4.0)[None, :]
    q, k, v = proj(x)
    assert torch.equal(q, 2 * x[:, :2]) and torch.equal(k, 2 * x[:, 2:]) and torch.equal(v, 3 * x)
