"""Greedy decoding of a synthetic GGUF model through the engine, for tests that compare settings."""

from __future__ import annotations

from pathlib import Path

import torch

from strata.engine.llm_engine import EngineConfig, LLMEngine
from strata.engine.sampler import SamplingParams
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.models import build_model
from strata.prompt.tokenizer import Tokenizer


def greedy_kernel_path(path: Path, device: str, max_tokens: int = 3) -> list[int]:
    """One prompt's greedy tokens in bf16 on the kernel path (on the CPU: STRATA_TRITON_ON_CPU=1 and
    Triton's interpreter), eager (no CUDA graphs); settings are read from the environment at build."""
    gguf = GGUFFile(path)
    model = build_model(gguf, ModelSpec.from_gguf(gguf), dtype=torch.bfloat16, device=device)
    assert model.place.kernels
    config = EngineConfig(num_blocks=16, cuda_graphs=False)
    engine = LLMEngine(model, Tokenizer.from_gguf(gguf.metadata), config)
    request = engine.add_request(list(range(3, 12)), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert request.error is None, request.error
    return list(request.output_ids)
