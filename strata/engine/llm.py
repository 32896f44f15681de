"""`LLM`: one loaded model and the single-sequence generation loop (prefill once, then decode)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from strata.engine.kv_cache import AttentionMetadata, KVCache
from strata.engine.sampler import SamplingParams, max_new_tokens, sample_batch
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.models import build_model
from strata.parallel.launch import start_tensor_parallel
from strata.parallel.leader import Leader
from strata.prompt.loading import load_prompt_side

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class ModelConfig:
    """How to load a model: built at the edge (CLI), passed down."""

    path: Path
    dtype: str = "float32"  # "auto": bfloat16 on a GPU, float32 on the CPU
    chat_template: str | None = None  # a built-in template's name, instead of the file's own
    device: str = "cpu"  # "auto": the GPU when torch sees one
    tensor_parallel: int = 1  # ranks (processes; one GPU each on cuda) that each hold about 1/N of each layer

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} is not supported; choose one of {', '.join(DEVICES)}")
        if self.device == "auto":
            object.__setattr__(self, "device", "cuda" if torch.cuda.is_available() else "cpu")
        n = self.tensor_parallel
        if n < 1:
            raise ValueError(f"--tensor-parallel {n}: the number of ranks must be at least 1")
        if n > 1 and self.device == "cuda":
            gpus = torch.cuda.device_count()
            if gpus == 0:
                raise ValueError(
                    "device 'cuda' was asked for, but torch sees no CUDA GPU here; use --device cpu"
                )
            if n > gpus:
                raise ValueError(
                    f"--tensor-parallel {n} needs {n} GPUs (one per rank), but torch sees {gpus} here; use "
                    f"--tensor-parallel {gpus} or fewer, or --device cpu (where the ranks are processes)"
                )
        if self.dtype == "auto":
            object.__setattr__(self, "dtype", "bfloat16" if self.device == "cuda" else "float32")
        if self.dtype not in DTYPES:
            choices = ", ".join(("auto", *DTYPES))
            raise ValueError(f"dtype {self.dtype!r} is not supported; choose one of {choices}")


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    finish_reason: str = ""  # "stop" (end-of-turn token) or "length" (max_tokens)

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        # The first generated token comes from the prefill step; the rest from decode steps.
        steps = self.generated_tokens - 1
        return steps / self.decode_s if steps > 0 and self.decode_s else 0.0


class LLM:
    """A GGUF model ready to generate: file, spec, weights, tokenizer and chat template."""

    def __init__(self, config: ModelConfig, progress: bool = False) -> None:
        self.config = config
        self.gguf = GGUFFile(config.path)
        self.spec = ModelSpec.from_gguf(self.gguf)
        self.tokenizer, self.chat_template = load_prompt_side(self.gguf.metadata, config.chat_template)
        dtype = DTYPES[config.dtype]
        self.leader: Leader | None = None
        if config.tensor_parallel == 1:
            self.model = build_model(self.gguf, self.spec, dtype, progress=progress, device=config.device)
        else:
            self.model, self.leader = start_tensor_parallel(self.gguf, self.spec, config, dtype, progress)
        self.stats = GenerationStats()

    def close(self) -> None:
        """End the tensor-parallel followers, if any (also done at interpreter exit)."""
        if self.leader is not None:
            self.leader.close()

    @torch.inference_mode()
    def prompt_logits(self, ids: list[int]) -> torch.Tensor:
        """(len(ids), vocab) float32 logits at every prompt position, in one prefill."""
        kv = self._kv_cache(len(ids))
        meta = AttentionMetadata.contiguous(0, len(ids), self.model.device)
        return self.model.step(torch.tensor(ids, device=self.model.device), kv, meta, slice(None))

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[int]:
        """Yield generated token ids as they are sampled; stops at an end-of-turn token, one of
        `params.stop_token_ids`, or max_tokens (None: the room left in the context).

        The stopping token itself is not yielded. Stop strings are text: a caller that wants them
        feeds the tokens through `strata.engine.stop.StopChecker`. `self.stats` describes the last call.
        """
        limit = self._check_length(len(prompt_ids), params)
        stats = self.stats = GenerationStats(prompt_tokens=len(prompt_ids))
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.tokenizer.eos_ids))
        kv = self._kv_cache(len(prompt_ids) + limit)
        history = list(prompt_ids)  # prompt + generated, for the penalties
        ids, start = prompt_ids, 0
        t0 = time.perf_counter()
        while stats.generated_tokens < limit:
            meta = AttentionMetadata.contiguous(start, len(ids), self.model.device)
            logits = self.model.step(torch.tensor(ids, device=self.model.device), kv, meta, slice(-1, None))
            token = sample_batch(logits, [params], [generator], [history], [len(prompt_ids)]).token_ids[0]
            now = time.perf_counter()
            if start == 0:
                stats.prefill_s = now - t0
            else:
                stats.decode_s = now - t0 - stats.prefill_s
            if token in stop_ids:
                stats.finish_reason = "stop"
                return
            stats.generated_tokens += 1
            history.append(token)
            yield token
            start += len(ids)
            ids = [token]
        stats.finish_reason = "length"

    def _check_length(self, prompt_len: int, params: SamplingParams) -> int:
        """The number of tokens this prompt may generate; ValueError when it does not fit."""
        if prompt_len == 0:
            raise ValueError("the prompt is empty; give at least one token")
        return max_new_tokens(params, prompt_len, self.spec.context_length)

    def _kv_cache(self, num_tokens: int) -> KVCache:
        s, model = self.spec, self.model
        kv_heads = model.place.tp.local(s.num_kv_heads)  # this rank's heads under tensor parallelism
        return KVCache(s.num_layers, num_tokens, kv_heads, s.head_dim, model.dtype, model.device)
