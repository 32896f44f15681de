"""STRATA_LIVE_SPLITS: decode attention runs only the splits each context fills (counted on the device)
of the split count fixed on the host. The kernel's own checks are in test_kernels_paged_attention."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from gguf.constants import GGMLQuantizationType as T  # noqa: E402

import strata.kernels.paged_attention as paged_attention  # noqa: E402
from strata import env  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_env(monkeypatch):
    monkeypatch.delenv("STRATA_LIVE_SPLITS", raising=False)
    assert env.live_splits() is False
    monkeypatch.setenv("STRATA_LIVE_SPLITS", "1")
    assert env.live_splits() is True
    monkeypatch.setenv("STRATA_LIVE_SPLITS", "on")
    with pytest.raises(ValueError, match="STRATA_LIVE_SPLITS='on' must be 0 or 1; unset it for 0"):
        env.live_splits()


def test_whole_model_tokens_unchanged(monkeypatch, tmp_path):
    # Short contexts under a split count made for the block table's capacity: with live splits each
    # takes one split, written by the split kernel (the merge skipped), the same bits as the merge of
    # one filled split and empty ones.
    from strata.gguf.synth import SynthSpec, write_synthetic
    from tests.synthetic_decode import greedy_kernel_path

    spec = SynthSpec(
        "llama",
        hidden_size=256,
        ffn_size=512,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        weight_type=T.Q8_0,
        context_length=2048,
    )
    path = write_synthetic(tmp_path / "m.gguf", spec)
    monkeypatch.setenv("STRATA_TRITON_ON_CPU", "1")
    real, asked = paged_attention.paged_decode_attention, []

    def spy(*args, **kwargs):
        asked.append((kwargs["num_splits"], kwargs["max_context_len"], kwargs["min_split_len"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(paged_attention, "paged_decode_attention", spy)
    monkeypatch.setenv("STRATA_LIVE_SPLITS", "0")
    every = greedy_kernel_path(path, DEVICE)
    assert asked and all(ask[2] == 1 for ask in asked)
    asked.clear()
    monkeypatch.setenv("STRATA_LIVE_SPLITS", "1")
    assert greedy_kernel_path(path, DEVICE) == every
    assert asked and all(ask[2] == paged_attention.MIN_SPLIT_LEN for ask in asked)
    # The host's split count is for the model's context length (2,048), more than these contexts fill.
    splits = paged_attention.choose_num_splits(1, 2, asked[0][1])
    assert splits > 1
