"""The host side of a graph-replayed decode step, with the captured graphs stood in for (no GPU).

What the runner hands the graphs (ids, positions, KV slots, block tables) and which logits it returns
must be right whatever replays them: a one-token step can mix decoding sequences with a one-token
prefill chunk that has more prompt to come, and that one has no logits due.
"""

from __future__ import annotations

from pathlib import Path

import torch

from strata.engine.model_runner import ModelRunner, ScheduledBatch
from strata.engine.request import Request
from strata.engine.sampler import SamplingParams
from strata.engine.sequence import Sequence
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.gguf.synth import SynthSpec, write_synthetic
from strata.models import build_model


class RecordingGraphs:
    """Stands in for DecodeGraphs: records the inputs, returns row b filled with b."""

    max_batch = 8

    def __init__(self, vocab: int) -> None:
        self.vocab, self.calls = vocab, []

    def run(self, ids, positions, slots, block_tables):  # type: ignore[no-untyped-def]
        self.calls.append((ids, positions, slots, block_tables))
        return torch.arange(len(ids), dtype=torch.float32)[:, None].expand(len(ids), self.vocab)


def _seq(prompt: list[int], computed: int, table: list[int]) -> Sequence:
    seq = Sequence(Request(f"r{len(prompt)}", tuple(prompt), SamplingParams()))
    seq.num_computed_tokens, seq.block_table = computed, table
    return seq


def test_decode_inputs_and_due_rows(tmp_path: Path) -> None:
    gguf = GGUFFile(write_synthetic(tmp_path / "m.gguf", SynthSpec("llama")))
    spec = ModelSpec.from_gguf(gguf)
    runner = ModelRunner(build_model(gguf, spec), num_blocks=8, block_size=4)
    graphs = RecordingGraphs(spec.vocab_size)
    runner.graphs = graphs  # type: ignore[assignment]
    decoding = _seq([5, 6, 7, 8, 9], computed=4, table=[3, 6])  # last prompt token, position 4
    chunk = _seq([1, 2, 3, 4, 5, 6], computed=2, table=[1, 2])  # one more prompt token, 3 to come
    after = _seq([9, 9], computed=2, table=[0])
    after.append_token(4)  # a generated token at position 2
    out = runner.run(ScheduledBatch((decoding, chunk, after), (1, 1, 1)))
    ((ids, positions, slots, tables),) = graphs.calls
    assert ids == [9, 3, 4] and positions == [4, 2, 2]
    assert slots == [6 * 4 + 0, 1 * 4 + 2, 0 * 4 + 2]
    assert tables == [[3, 6], [1, 2], [0]]
    assert out.seqs == (decoding, after)
    assert out.logits[:, 0].tolist() == [0.0, 2.0]
