"""CPU prefill and decode speed: strata against llama.cpp (and optionally transformers), same file, one run.

    python benchmarks/cpu_generate.py [--model qwen2.5-coder-0.5b] [--prompt-tokens 512]
        [--decode-tokens 128] [--threads 2] [--repeats 3] [--transformers]

Every engine gets the same prompt token ids and decodes greedily for a fixed number of tokens (end of
turn ignored). Runs are interleaved (strata, llama.cpp, strata, llama.cpp, ...) so drift hits both;
the table quotes medians and the median of the per-pair ratios. llama.cpp runs through
llama-cpp-python when it is installed (`pip install 'strata[bench]'`) and is skipped otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from strata.engine.llm import LLM, ModelConfig
from strata.engine.sampler import SamplingParams
from strata.model_store import DEFAULT_MODEL, resolve_model

CORPUS = (
    "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n"
    '    """Merge two sorted lists into one sorted list."""\n'
    "    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n"
    "        else:\n            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n\n"
    "The quick brown fox jumps over the lazy dog while the committee reviews the quarterly report. "
)


@dataclass
class Timing:
    prefill_s: float
    decode_s: float
    tokens: list[int]


def prompt_of(llm: LLM, num_tokens: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < num_tokens:
        ids += llm.tokenizer.encode(CORPUS)
    return ids[:num_tokens]


def run_strata(llm: LLM, ids: list[int], decode_tokens: int) -> Timing:
    params = SamplingParams(max_tokens=decode_tokens + 1, ignore_eos=True)
    tokens = list(llm.generate(ids, params))
    return Timing(llm.stats.prefill_s, llm.stats.decode_s, tokens[1:])


def make_llama_cpp(path: str, n_ctx: int, threads: int) -> Callable[[list[int], int], Timing] | None:
    try:
        import llama_cpp
        import numpy as np
    except ImportError:
        return None
    model = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=512, n_threads=threads, verbose=False)
    vocab = model.n_vocab()

    def last_argmax() -> int:
        # llama-cpp-python keeps no logits unless logits_all (which would slow its prefill): read them.
        logits = llama_cpp.llama_get_logits_ith(model.ctx, -1)
        return int(np.ctypeslib.as_array(logits, shape=(vocab,)).argmax())

    def run(ids: list[int], decode_tokens: int) -> Timing:
        model.reset()
        t0 = time.perf_counter()
        model.eval(ids)
        token = last_argmax()
        t1 = time.perf_counter()
        tokens = []
        for _ in range(decode_tokens):
            model.eval([token])
            token = last_argmax()
            tokens.append(token)
        return Timing(t1 - t0, time.perf_counter() - t1, tokens)

    return run


def make_transformers(path, threads: int) -> Callable[[list[int], int], Timing]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)

    @torch.inference_mode()
    def run(ids: list[int], decode_tokens: int) -> Timing:
        t0 = time.perf_counter()
        out = model(torch.tensor([ids]), use_cache=True)
        token = int(out.logits[0, -1].argmax())
        t1 = time.perf_counter()
        past, tokens = out.past_key_values, []
        for _ in range(decode_tokens):
            out = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
            past, token = out.past_key_values, int(out.logits[0, -1].argmax())
            tokens.append(token)
        return Timing(t1 - t0, time.perf_counter() - t1, tokens)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--transformers", action="store_true", help="also time transformers (slow)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    llm = LLM(ModelConfig(path, args.dtype))
    ids = prompt_of(llm, args.prompt_tokens)
    n_ctx = args.prompt_tokens + args.decode_tokens + 8
    engines: dict[str, Callable[[list[int], int], Timing]] = {
        f"strata {args.dtype}": lambda i, n: run_strata(llm, i, n)
    }
    if (llama := make_llama_cpp(str(path), n_ctx, args.threads)) is not None:
        engines["llama.cpp"] = llama
    else:
        print("llama-cpp-python is not installed: pip install 'strata[bench]' to compare against llama.cpp")
    if args.transformers:
        engines["transformers float32"] = make_transformers(path, args.threads)
    for run in engines.values():  # warm-up, untimed
        run(ids[:32], 4)
    results: dict[str, list[Timing]] = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name, run in engines.items():
            results[name].append(run(ids, args.decode_tokens))
    report(results, args.prompt_tokens, args.decode_tokens)


def report(results: dict[str, list[Timing]], prompt_tokens: int, decode_tokens: int) -> None:
    base_name = next(iter(results))
    base = results[base_name]
    print(f"\nprompt {prompt_tokens} tokens, {decode_tokens} decoded, median of {len(base)} interleaved runs")
    print(
        f"{'engine':<22}{'prefill tok/s':>15}{'decode tok/s':>14}{'strata/it prefill':>19}"
        f"{'strata/it decode':>18}{'same tokens':>13}"
    )
    for name, runs in results.items():
        pre = statistics.median(prompt_tokens / r.prefill_s for r in runs)
        dec = statistics.median(decode_tokens / r.decode_s for r in runs)
        ratio_pre = statistics.median(r.prefill_s / b.prefill_s for r, b in zip(runs, base, strict=True))
        ratio_dec = statistics.median(r.decode_s / b.decode_s for r, b in zip(runs, base, strict=True))
        pairs = zip(runs[0].tokens, base[0].tokens, strict=True)
        same = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        agree = "all" if same is None else f"first {same}"
        print(f"{name:<22}{pre:>15.1f}{dec:>14.2f}{ratio_pre:>19.2f}{ratio_dec:>18.2f}{agree:>13}")


if __name__ == "__main__":
    main()
