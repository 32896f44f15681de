"""The peers, driven by the same prompt ids as strata: llama.cpp (llama-cpp-python) and transformers.

Both decode greedily by taking the argmax of the last position's logits themselves, so no sampler
setting of the peer can change what is measured.

Nothing here imports torch at module level: a llamacpp worker must never load it, since on the GPU
machine llama.cpp's CUDA libraries and torch's cannot share a process (a segfault inside
llama_model_load_from_file with torch loaded first, an abort in torch's import the other way round;
benchmarks/llamacpp_cuda/diag.py shows it).
"""

from __future__ import annotations

import time

import numpy as np

from .runners import Measurement, WorkerConfig
from .workload import Workload


class LlamaCppRunner:
    def __init__(self, config: WorkerConfig) -> None:
        try:
            import llama_cpp
        except ImportError as e:
            raise ValueError("the llamacpp arm needs llama-cpp-python: pip install 'strata[bench]'") from e
        self._lib = llama_cpp
        n_batch = int(config.options.get("n_batch", 512))
        self.model = llama_cpp.Llama(
            model_path=str(config.model_path),
            n_ctx=max(config.max_context, 64),
            n_batch=n_batch,
            n_ubatch=n_batch,
            n_threads=config.threads,
            n_threads_batch=config.threads,
            # On a GPU every layer goes there, with flash attention, as GPU.md's peer figures were taken.
            n_gpu_layers=-1 if config.device == "cuda" else 0,
            flash_attn=config.device == "cuda",
            # Its load log goes to the arm's log file (the worker's stderr): with verbose=False
            # llama-cpp-python points fd 2 at /dev/null while loading, hiding why a load died.
            verbose=True,
        )
        self.vocab = self.model.n_vocab()

    def _argmax(self) -> int:
        # llama-cpp-python keeps no logits unless logits_all (which slows its prefill): read the last row.
        logits = self._lib.llama_get_logits_ith(self.model.ctx, -1)
        return int(np.ctypeslib.as_array(logits, shape=(self.vocab,)).argmax())

    def run(self, workload: Workload, prompts: list[list[int]]) -> Measurement:
        if workload.batch != 1:
            raise ValueError(f"the llamacpp arm decodes one sequence; batch {workload.batch} needs --batch 1")
        ids = prompts[0]
        self.model.reset()
        if workload.depth:
            self.model.eval(ids[: workload.depth])
        t0 = time.perf_counter()
        self.model.eval(ids[workload.depth :])
        tokens = [self._argmax()]
        t1 = time.perf_counter()
        for _ in range(workload.num_generated - 1):
            self.model.eval([tokens[-1]])
            tokens.append(self._argmax())
        t2 = time.perf_counter()
        return Measurement(t1 - t0, t2 - t1 if workload.mode == "decode" else 0.0, [tokens])


class TransformersRunner:
    def __init__(self, config: WorkerConfig) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(config.threads)
        dtype = getattr(torch, config.options.get("dtype", "float32"))
        path = config.model_path
        self.model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
        self.device = torch.device(config.device)
        self.model = self.model.to(self.device).eval()  # type: ignore[arg-type]

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def run(self, workload: Workload, prompts: list[list[int]]) -> Measurement:
        import torch

        with torch.inference_mode():
            return self._run(workload, prompts)

    def _run(self, workload: Workload, prompts: list[list[int]]) -> Measurement:
        import torch

        ids = torch.tensor(prompts, device=self.device)  # (batch, depth + prompt_len): equal lengths
        past = None
        if workload.depth:
            past = self.model(ids[:, : workload.depth], use_cache=True).past_key_values
        self._sync()
        t0 = time.perf_counter()
        out = self.model(ids[:, workload.depth :], past_key_values=past, use_cache=True)
        token = out.logits[:, -1].argmax(-1)  # (batch,)
        steps = [token]
        self._sync()
        t1 = time.perf_counter()
        for _ in range(workload.num_generated - 1):
            out = self.model(token[:, None], past_key_values=out.past_key_values, use_cache=True)
            token = out.logits[:, -1].argmax(-1)
            steps.append(token)
        self._sync()
        t2 = time.perf_counter()
        tokens = torch.stack(steps, dim=1).tolist()
        return Measurement(t1 - t0, t2 - t1 if workload.mode == "decode" else 0.0, tokens)
