"""Prefill graphs: a step's inputs padded to a captured size, and the model's tokens through them.

Without a GPU nothing is captured: `PrefillGraphs(capture=False)` runs each step's body eagerly on
the same padded buffers, in Triton's interpreter, so the padding, the rows and the logits that come
back are checked here; the captured graphs are checked on the GPU (test_gpu_prefill_graphs_...).
"""

from __future__ import annotations

import os

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from strata.engine.prefill_graphs import (  # noqa: E402
    PrefillGraphs,
    PrefillInputs,
    graph_sizes,
    prefill_tokens,
)

SCRATCH, BLOCK = 9, 4


def test_inputs_pad_the_step_with_one_more_sequence() -> None:
    inputs = PrefillInputs(16, 4, 3, torch.device("cpu"), SCRATCH, BLOCK)
    inputs.upload((16, 3), [([5, 6, 7], 2, [1, 2]), ([8, 9], 0, [6])], [2, 4])
    ids, meta, rows = inputs.metadata((16, 3))
    paged = meta.paged_prefill
    assert paged is not None and paged.max_query_len == 16
    pad = SCRATCH * BLOCK
    assert ids.tolist() == [5, 6, 7, 8, 9] + [0] * 11
    assert meta.positions.tolist() == [2, 3, 4, 0, 1] + list(range(11))
    assert meta.slot_mapping.tolist() == [6, 7, 8, 24, 25] + [pad] * 11
    assert paged.query_start.tolist() == [0, 3, 5, 16]
    assert paged.context_lens.tolist() == [5, 2, 11]
    assert paged.block_tables[0, :2].tolist() == [1, 2] and paged.block_tables[2].tolist() == [SCRATCH] * 3
    assert rows.tolist() == [2, 4, 0]
    # A later step of one sequence in a bigger size: the sequences past the padding one are empty.
    inputs.upload((16, 4), [([1], 7, [3, 5])], [])
    ids, meta, rows = inputs.metadata((16, 4))
    paged = meta.paged_prefill
    assert paged is not None
    assert paged.query_start.tolist() == [0, 1, 16, 16, 16] and paged.context_lens.tolist() == [8, 15, 0, 0]
    assert meta.slot_mapping[0].item() == 5 * 4 + 3 and rows.tolist() == [0] * 4


@pytest.mark.parametrize(
    "size, seqs, tokens",
    [((16, 2), 2, 4), ((8, 3), 1, 9), ((32, 3), 1, 4), ((16, 5), 1, 4)],
    ids=[
        "no room for the padding sequence",
        "too many tokens",
        "bigger than the buffer",
        "too many sequences",
    ],
)
def test_refuses_a_step_that_does_not_fit(size: tuple[int, int], seqs: int, tokens: int) -> None:
    inputs = PrefillInputs(16, 4, 3, torch.device("cpu"), SCRATCH, BLOCK)
    step = [([1] * tokens, 0, [0, 1, 2])] + [([1], 0, [0])] * (seqs - 1)
    with pytest.raises(ValueError, match="needs a size"):
        inputs.upload(size, step, [])


def test_sizes() -> None:
    assert prefill_tokens((16, 64, 32, 2048, 128), 100) == (16, 32, 64, 128)
    assert prefill_tokens((16, 64), 64) == (16, 64)
    assert prefill_tokens((16, 64), 5000) == (16, 64)
    assert graph_sizes((16, 64), 8) == [(64, 9), (64, 2), (16, 9), (16, 2)]
    assert graph_sizes((4,), 8) == [(4, 5), (4, 2)]
    with pytest.raises(ValueError, match="must be positive"):
        graph_sizes((), 8)


class CountingGraphs(PrefillGraphs):
    """Uncaptured prefill graphs that count the sizes they ran."""

    def run(self, size, seqs, due):  # type: ignore[no-untyped-def]
        self.ran.append(size)
        return super().run(size, seqs, due)


@pytest.mark.skipif(CUDA, reason="the uncaptured stand-in runs on the CPU; the GPU test captures")
def test_padded_steps_give_the_eager_tokens(tmp_path: Path) -> None:
    """Three prompts (9, 22 and 35 tokens) in steps of 24 tokens (two prompts' chunks, later with
    decodes), each padded to 32 rows, against the eager kernel path."""
    pytest.importorskip("triton")
    from strata.engine.scheduler import SchedulerConfig
    from strata.gguf.synth import SynthSpec, write_synthetic
    from tests.test_model_kernel_path import greedy_ids

    spec = SynthSpec("llama", num_layers=1)
    path = write_synthetic(tmp_path / "m.gguf", spec)
    options = {"cuda_graphs": False, "scheduler": SchedulerConfig(max_num_batched_tokens=24)}
    eager = greedy_ids(path, "cpu", kernels=True, num_tokens=2, **options)
    ran: list[tuple[int, int]] = []

    def with_graphs(engine):  # type: ignore[no-untyped-def]
        r = engine.runner
        graphs = CountingGraphs(r.model, r.kv, r.block_size, r.max_blocks, 64, (16, 32), 64, capture=False)
        graphs.ran = ran
        r.prefill_graphs = graphs

    assert greedy_ids(path, "cpu", kernels=True, num_tokens=2, setup=with_graphs, **options) == eager
    # Every prompt step mixes sequences (prompts, or prompts and decodes): the graph for 32 tokens and
    # up to 32 sequences ran them all.
    assert ran and set(ran) == {(32, 33)}


@pytest.mark.skipif(not CUDA, reason="captures CUDA graphs")
@pytest.mark.parametrize("layout", ["qwen2.5-0.5b-tiny", "qwen2.5-1.5b-tiny"])
def test_gpu_prefill_graphs_match_cpu_reference(layout: str, tmp_path: Path) -> None:
    """Captured prefill graphs, the whole prompt step at once (66 tokens: the 128-token graph) and in
    chunks of 24 with decodes (the 32-token graph), against the CPU reference's greedy ids."""
    from strata.engine.scheduler import SchedulerConfig
    from strata.synth.layouts import load_layout
    from strata.synth.writer import write_layout
    from tests.test_model_kernel_path import greedy_ids

    path = tmp_path / f"{layout}.gguf"
    write_layout(path, load_layout(layout), seed=0)
    ref = greedy_ids(path, "cpu", kernels=False, num_tokens=32)
    sizes = (16, 32, 64, 128)
    assert greedy_ids(path, "cuda", kernels=True, num_tokens=32, prefill_graph_tokens=sizes) == ref
    chunks = SchedulerConfig(max_num_batched_tokens=24)
    assert (
        greedy_ids(path, "cuda", kernels=True, num_tokens=32, prefill_graph_tokens=sizes, scheduler=chunks)
        == ref
    )
