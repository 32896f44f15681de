"""Decode-path settings that must not change a bit, each run against one run of the defaults on the
same synthetic model (kernel path, bf16, llama blocks; Q8_0 weights on int8 x, as gguf writes no
K-quants), made once for the module: an interpreted run takes about 15 s. The ids and every step's
logits are compared.

- STRATA_QUANT_IN_NORM=0: the int8 matvecs quantize x in launches of their own (default: the norms do)
- STRATA_ACT_IN_QUANT=0: the gated activation launched on its own (default: inside x's quantization)
- STRATA_LIVE_SPLITS=1: decode attention runs only the splits each context fills
- STRATA_SHORT_GRAPHS=256: short contexts split by a bound of 256 positions (with STRATA_SHORT_SPLITS,
  _BLOCK_T and _STAGES at 0; and at others, launched as those say). The defaults' bound of 2,048 is the
  model's whole length here, so the defaults run the long set.
- STRATA_ATTENTION_PREFETCH=0 with STRATA_MERGE_WARPS=1: decode attention loads its first tile after
  the wait, and its merge runs on one warp
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from gguf.constants import GGMLQuantizationType as T  # noqa: E402

import strata.engine.llm_engine as llm_engine  # noqa: E402
import strata.kernels.paged_attention as paged_attention  # noqa: E402
import strata.kernels.quant_matvec as quant_matvec  # noqa: E402
import strata.layers.linear as linear  # noqa: E402
from strata.gguf.synth import SynthSpec, write_synthetic  # noqa: E402
from tests.synthetic_decode import greedy_kernel_path  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class Run:
    ids: list[int]
    quantize_x: int = 0  # quantize_x launches
    gated: int = 0  # gated activations launched on their own
    logits: list[torch.Tensor] = field(default_factory=list)  # each step's, as the sampler gets them
    attention: list[dict[str, Any]] = field(default_factory=list)  # each paged_decode_attention's kwargs


def decode(path: Path, **settings: str) -> Run:
    """Greedy ids with the STRATA_* `settings` (names without the prefix), counting the launches the
    settings leave out."""
    run = Run([])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_TRITON_ON_CPU", "1")
        mp.setenv("STRATA_INT8_X", "Q8_0")
        for name, value in settings.items():
            mp.setenv(f"STRATA_{name}", value)
        quantize, gated = quant_matvec.quantize_x, linear.gated
        attend = paged_attention.paged_decode_attention
        sample = llm_engine.sample_batch

        def count_quantize(*args, **kwargs):
            run.quantize_x += 1
            return quantize(*args, **kwargs)

        def count_gated(*args):
            run.gated += 1
            return gated(*args)

        def record_logits(logits, *args):
            run.logits.append(logits.clone())
            return sample(logits, *args)

        def record_attention(*args, **kwargs):
            run.attention.append(kwargs)
            return attend(*args, **kwargs)

        mp.setattr(quant_matvec, "quantize_x", count_quantize)
        mp.setattr(linear, "gated", count_gated)
        mp.setattr(paged_attention, "paged_decode_attention", record_attention)
        mp.setattr(llm_engine, "sample_batch", record_logits)
        run.ids = greedy_kernel_path(path, DEVICE)
    return run


def assert_same_bits(run: Run, expected: Run) -> None:
    """The same ids and every step's logits bit for bit (this random model's ids hardly move with its
    hidden states; its logits do)."""
    assert run.ids == expected.ids
    assert len(run.logits) == len(expected.logits) == len(run.ids)
    for step, (a, b) in enumerate(zip(run.logits, expected.logits, strict=True)):
        assert torch.equal(a, b), f"step {step}'s logits differ"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    spec = SynthSpec(
        "llama", hidden_size=64, ffn_size=128, num_heads=2, num_kv_heads=1, head_dim=64, weight_type=T.Q8_0,
        context_length=2048,
    )  # fmt: skip
    return write_synthetic(tmp_path_factory.mktemp("decode_settings") / "m.gguf", spec)


@pytest.fixture(scope="module")
def defaults(model: Path) -> Run:
    return decode(model)


def test_quantization_in_the_norm(model: Path, defaults: Run):
    separate = decode(model, QUANT_IN_NORM="0")
    assert_same_bits(separate, defaults)
    assert defaults.quantize_x < separate.quantize_x  # decode's q/k/v and gate/up inputs came quantized


def test_activation_in_the_quantization(model: Path, defaults: Run):
    separate = decode(model, ACT_IN_QUANT="0")
    assert_same_bits(separate, defaults)
    assert defaults.gated < separate.gated  # decode's activations went into the quantization


def test_live_splits(model: Path, defaults: Run):
    # Short contexts under a split count made for the model's context length (2,048): with live
    # splits each takes one split, written by the split kernel (the merge skipped), the same bits as
    # the merge of one filled split and empty ones. (These contexts are within one tile of 64; past
    # it the default merges several filled splits: other bits on a GPU, benchmarks/split_bits.py.)
    live = decode(model, LIVE_SPLITS="1")
    assert_same_bits(live, defaults)
    assert defaults.attention and all(kw["min_split_len"] == 1 for kw in defaults.attention)
    least = paged_attention.MIN_SPLIT_LEN
    assert live.attention and all(kw["min_split_len"] == least for kw in live.attention)
    assert paged_attention.choose_num_splits(1, 2, live.attention[0]["max_context_len"]) > 1


def test_short_context_bound(model: Path, defaults: Run):
    # STRATA_SHORT_GRAPHS=256: these short contexts are split by a bound of 256 positions (one split,
    # no merge) instead of the model's 2,048 (here one filled split of eight): the same bits.
    short = decode(model, SHORT_GRAPHS="256", SHORT_SPLITS="0", SHORT_BLOCK_T="0", SHORT_STAGES="0")
    assert_same_bits(short, defaults)
    assert {kw["max_context_len"] for kw in defaults.attention} == {2048}
    assert {kw["max_context_len"] for kw in short.attention} == {256}


def test_short_attention_launch(model: Path, defaults: Run):
    # The short set's own launch (STRATA_SHORT_SPLITS, _BLOCK_T, _STAGES) reaches the kernel; these
    # contexts (10 and 11 positions) fill one tile of either size, so the bits are the defaults'.
    short = decode(model, SHORT_GRAPHS="256", SHORT_SPLITS="4", SHORT_BLOCK_T="16", SHORT_STAGES="2")
    assert_same_bits(short, defaults)
    keys = ("max_context_len", "num_splits", "max_splits", "block_t", "num_stages")
    launches = {tuple(kw[key] for key in keys) for kw in short.attention}
    assert launches == {(2048, None, 4, 16, 2)}  # at most 4 splits, counted for the model's 2,048
    assert {(kw["num_splits"], kw["block_t"]) for kw in defaults.attention} == {(None, None)}


def test_attention_prefetch_and_merge_warps(model: Path, defaults: Run):
    # STRATA_ATTENTION_PREFETCH=0 (the default, tile, loads each split's first K/V tile before the
    # wait) and STRATA_MERGE_WARPS=1 reaching the kernel launch: the same bits.
    other = decode(model, ATTENTION_PREFETCH="0", MERGE_WARPS="1")
    assert_same_bits(other, defaults)
    assert {kw["merge_warps"] for kw in defaults.attention} == {None}
    assert other.attention and {kw["merge_warps"] for kw in other.attention} == {1}
