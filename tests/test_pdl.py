"""Programmatic dependent launch (strata.kernels.pdl): asked for by STRATA_PDL, used only where it can
be. Whether its kernels compile with the waits is in test_kernels_compile (compile_check's "pdl"
variant); whether a whole model's tokens are unchanged with it, in test_model_kernel_path (GPU)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from strata import env  # noqa: E402
from strata.kernels import pdl  # noqa: E402
from strata.kernels.rms_norm import rms_norm  # noqa: E402


def test_env_values(monkeypatch):
    monkeypatch.delenv("STRATA_PDL", raising=False)
    assert env.pdl() == 2
    monkeypatch.setenv("STRATA_PDL", "1")
    assert env.pdl() == 1
    monkeypatch.setenv("STRATA_PDL", "0")
    assert env.pdl() == 0
    monkeypatch.setenv("STRATA_PDL", "2")
    assert env.pdl() == 2
    monkeypatch.setenv("STRATA_PDL", "on")
    with pytest.raises(ValueError, match="STRATA_PDL='on' must be 0, 1 or 2; unset it for 2"):
        env.pdl()


def test_no_pdl_off_the_gpu_or_when_not_asked(monkeypatch):
    monkeypatch.setenv("STRATA_PDL", "1")
    assert pdl.launch_args(torch.device("cpu")) == {}
    monkeypatch.setenv("STRATA_PDL", "0")
    assert pdl.launch_args(torch.device("cuda")) == {}


def test_kernels_run_alike_when_pdl_is_asked_for_on_the_cpu(monkeypatch):
    # Off the GPU the request is ignored: the same kernel, the same values.
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(0))
    w = torch.rand(96, generator=torch.Generator().manual_seed(1)) + 0.5
    monkeypatch.setenv("STRATA_PDL", "0")
    expected = rms_norm(x, w, 1e-6)
    monkeypatch.setenv("STRATA_PDL", "1")
    assert torch.equal(rms_norm(x, w, 1e-6), expected)
