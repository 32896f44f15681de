"""STRATA_DECODE_STEPS: decode steps run ahead on the device, each fed the argmax of the one before.

Without a GPU the decode graphs run uncaptured (`DecodeGraphs(capture=False)`: the same buffers and
the same device-side feeding, each step's body run eagerly) on the kernel path in Triton's
interpreter. Running ahead must give exactly the tokens of one step at a time, stop where they stop,
and give every KV block back. The same stand-in checks that a short set of graphs with a launch of its
own (STRATA_SHORT_*) calls decode attention as the eager path does.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.engine.cuda_graphs import DecodeGraphs  # noqa: E402
from strata.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from strata.engine.sampler import SamplingParams  # noqa: E402
from strata.gguf.reader import GGUFFile  # noqa: E402
from strata.gguf.spec import ModelSpec  # noqa: E402
from strata.gguf.synth import SynthSpec, write_synthetic  # noqa: E402
from strata.models import build_model  # noqa: E402
from strata.prompt.tokenizer import Tokenizer  # noqa: E402

BLOCKS = 64
PROMPTS = [[(7 * i + 11 * j) % 200 + 3 for j in range(9 + 13 * i)] for i in range(3)]
TOKENS = 6  # the first from the prefill, then 3 ahead and the 2 left

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the uncaptured stand-in is for the CPU")


@pytest.fixture(scope="module")
def engine_for(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path = write_synthetic(tmp_path_factory.mktemp("m") / "m.gguf", SynthSpec("llama", num_layers=1))
    os.environ["STRATA_TRITON_ON_CPU"] = "1"
    try:
        gguf = GGUFFile(path)
        model = build_model(gguf, ModelSpec.from_gguf(gguf), dtype=torch.float32, device="cpu")
    finally:
        os.environ.pop("STRATA_TRITON_ON_CPU")
    tokenizer = Tokenizer.from_gguf(gguf.metadata)

    def make(graphs: bool) -> tuple[LLMEngine, list[int]]:
        """An engine on the kernel path (16-token blocks); with `graphs`, uncaptured decode graphs whose
        runs ahead are counted in the returned list."""
        engine = LLMEngine(model, tokenizer, EngineConfig(num_blocks=BLOCKS, cuda_graphs=False))
        ran: list[int] = []
        if graphs:
            r = engine.runner
            sizes = (1, 2, 4)
            r.graphs = DecodeGraphs(
                r.model, r.kv, r.block_size, r.max_blocks, BLOCKS, sizes, r.short, capture=False
            )
            ahead = r.argmax_steps
            r.argmax_steps = lambda batch, steps: ran.append(steps) or ahead(batch, steps)  # type: ignore[method-assign]
        return engine, ran

    return make


@pytest.fixture(scope="module")
def single(engine_for) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """The tokens of one step at a time."""
    return run(engine_for(graphs=False)[0], [SamplingParams(max_tokens=TOKENS, ignore_eos=True)] * 3)


def run(engine: LLMEngine, params: list[SamplingParams]) -> list[list[int]]:
    requests = [engine.add_request(p, q) for p, q in zip(PROMPTS, params, strict=True)]
    while engine.has_unfinished():
        engine.step()
    engine.blocks.check_invariants()
    assert engine.blocks.num_free_blocks == BLOCKS  # free or cached: every block came back
    return [list(r.output_ids) for r in requests]


def test_running_ahead_gives_the_tokens_of_single_steps(engine_for, single, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("STRATA_DECODE_STEPS", "3")
    engine, ran = engine_for(graphs=True)
    assert run(engine, [SamplingParams(max_tokens=TOKENS, ignore_eos=True)] * 3) == single
    assert ran == [3, 2]  # at most the tokens left
    # A stop token met inside a run ahead: each request ends at its first one, the rest is dropped.
    stop = single[0][2]
    expected = [ids[: ids.index(stop) + 1] if stop in ids else ids for ids in single]
    stopping = [SamplingParams(max_tokens=TOKENS, ignore_eos=True, stop_token_ids=(stop,))] * 3
    assert run(engine_for(graphs=True)[0], stopping) == expected


def test_a_request_that_needs_the_host_keeps_single_steps(engine_for, single, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("STRATA_DECODE_STEPS", "3")
    params = [SamplingParams(max_tokens=TOKENS, ignore_eos=True)] * 2
    params.append(SamplingParams(max_tokens=TOKENS, ignore_eos=True, logprobs=True))
    engine, ran = engine_for(graphs=True)
    assert run(engine, params) == single and ran == []


def test_short_graphs_launch_attention_as_eager_steps(engine_for, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A short set with a launch of its own (at most 4 splits of 16-position tiles in 2 stages): the
    # uncaptured graphs call decode attention as the eager path does, at contexts of up to 41
    # positions (3 tiles, so splits merge), and give its tokens.
    import strata.kernels.paged_attention as paged_attention

    for name, value in (("GRAPHS", "128"), ("SPLITS", "4"), ("BLOCK_T", "16"), ("STAGES", "2")):
        monkeypatch.setenv(f"STRATA_SHORT_{name}", value)
    monkeypatch.setenv("STRATA_DECODE_STEPS", "1")
    attend, keys = paged_attention.paged_decode_attention, ("max_context_len", "num_splits", "max_splits")
    tokens, launches = {}, {}
    for graphs in (False, True):
        seen: set[tuple] = set()

        def record(*args, seen=seen, **kwargs):  # type: ignore[no-untyped-def]
            seen.add(tuple(kwargs[key] for key in keys) + (kwargs["block_t"], kwargs["num_stages"]))
            return attend(*args, **kwargs)

        monkeypatch.setattr(paged_attention, "paged_decode_attention", record)
        engine, _ = engine_for(graphs=graphs)
        assert engine.runner.short.positions == 128
        tokens[graphs] = run(engine, [SamplingParams(max_tokens=TOKENS, ignore_eos=True)] * 3)
        launches[graphs] = seen
    assert tokens[True] == tokens[False]
    max_positions = engine.runner.max_blocks * engine.runner.block_size
    assert max_positions > 128  # so the short set serves these steps
    assert launches[True] == launches[False] == {(max_positions, None, 4, 16, 2)}
