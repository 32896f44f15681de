"""The real server under load, in-process: many streaming clients, some of which leave early.

    python benchmarks/server_load.py [--clients 32] [--seconds 60] [--leave-every 4] [--leave-after 3]
        [--model qwen2.5-coder-0.5b] [--num-blocks 1024] [--overhead-reps 5] [--overhead-tokens 32]

The serving stack is built as `strata serve` builds it (`build_runtime`, as tests/conftest.py's
`runtime` fixture does) and served by uvicorn on loopback in a thread; the clients are httpx coroutines
in the main thread of the same process, so they share its GIL with the server and the engine thread.

1. Overhead, on the idle server, one client, interleaved repetitions on fresh prompts (greedy, the
   end-of-turn tokens banned by logit_bias so every run is exactly `--overhead-tokens` long):
   - time to first token over HTTP (request sent to the first SSE data line, which the server writes
     once the first token exists) minus the engine's own time to first token for the same prompt ids
     (a second `LLMEngine` over the same model weights, stepped directly while the server's engine
     thread sleeps), reported as the median of the paired differences;
   - streamed decode tokens/s (completion tokens after the first over the time from the first to the
     last data line) against the engine's offline decode tokens/s for the same prompt and max_tokens
     (the `LLMEngine.generate` loop, stepped by hand to split prefill from decode).
2. Load: `--clients` clients loop over varied short chats (OpenAI chat completions and Anthropic
   messages, streamed, max_tokens 8-48, greedy or sampled) for `--seconds`; every `--leave-every`-th
   request of a client disconnects after `--leave-after` data lines. In-flight requests then finish.
   RSS is sampled every second; the first `--warmup-seconds` of the load are warm-up.
3. At the end the engine must be idle with every KV block free or cached (`Stats.num_free_blocks`
   counts both), and no request may have failed.

Tokens/s under load counts the completion tokens of finished requests (their usage) plus the content
chunks the leaving clients received (a lower bound of what the engine generated for them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil
import torch
import uvicorn
from fastapi import FastAPI

from strata.engine.llm import ModelConfig
from strata.engine.llm_engine import EngineConfig, LLMEngine
from strata.engine.sampler import SamplingParams
from strata.model_store import DEFAULT_MODEL, resolve_model
from strata.server.config import ServerConfig
from strata.server.runtime import Runtime, build_runtime

MODEL_NAME = "strata-load"
TOPICS = [
    "Write a Python function that reverses a string.",
    "What does the `yield` keyword do in Python?",
    "Explain a hash map in one paragraph.",
    "Give three uses of the Unix `find` command.",
    "How do I read a JSON file in Python?",
    "What is the difference between a list and a tuple?",
    "Write a SQL query that counts rows per day.",
    "Name two sorting algorithms and their complexity.",
    "How do I create a virtual environment?",
    "What is a race condition?",
    "Write a bash loop over the files in a folder.",
    "What does HTTP status 503 mean?",
]


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """uvicorn on a free loopback port in a daemon thread (as tests/live_server.py does)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


# ---- one streamed request -------------------------------------------------------------------------


@dataclass
class Result:
    api: str
    ttft_s: float | None = None
    tokens: int = 0  # usage's completion tokens, or content chunks received when the client left
    left_early: bool = False
    error: str | None = None
    first_s: float = 0.0  # monotonic times of the first and last data lines
    last_s: float = 0.0


def _body(api: str, messages: list[dict[str, str]], params: dict[str, Any]) -> dict[str, Any]:
    if api == "anthropic":
        return {"model": MODEL_NAME, "messages": messages, "stream": True} | params
    return {
        "model": MODEL_NAME,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    } | params


async def stream_one(
    client: httpx.AsyncClient, api: str, body: dict[str, Any], leave_after: int | None = None
) -> Result:
    """Send one streamed chat; with `leave_after`, disconnect after that many data lines."""
    route = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
    result, start, lines = Result(api), time.monotonic(), 0
    try:
        async with client.stream("POST", route, json=body) as response:
            if response.status_code != 200:
                result.error = f"{response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.monotonic()
                if lines == 0:
                    result.ttft_s, result.first_s = now - start, now
                result.last_s, lines = now, lines + 1
                data = json.loads(line[6:])
                if "error" in data or data.get("type") == "error":
                    result.error = f"in-stream error: {line[:200]}"
                    return result
                result.tokens = _tokens(api, data, result.tokens)
                if leave_after is not None and lines >= leave_after:
                    result.left_early = True
                    return result  # leaving the block closes the connection: the server aborts
    except httpx.HTTPError as e:
        result.error = f"{type(e).__name__}: {e}"
    return result


def _tokens(api: str, data: dict[str, Any], counted: int) -> int:
    """Usage's completion tokens when the chunk has it, else one more per content chunk."""
    if api == "anthropic":
        if data.get("type") == "message_delta":
            return int(data["usage"]["output_tokens"])
        return counted + (data.get("type") == "content_block_delta")
    if data.get("usage"):
        return int(data["usage"]["completion_tokens"])
    choices = data.get("choices") or [{}]
    return counted + bool(choices[0].get("delta", {}).get("content"))


# ---- overhead: HTTP against the engine alone ------------------------------------------------------


@dataclass
class Overhead:
    http_ttft: list[float] = field(default_factory=list)
    engine_ttft: list[float] = field(default_factory=list)
    http_decode: list[float] = field(default_factory=list)  # tokens/s
    engine_decode: list[float] = field(default_factory=list)


def engine_alone(engine: LLMEngine, ids: list[int], params: SamplingParams) -> tuple[float, float]:
    """(time to first token, decode tokens/s) of the `LLMEngine.generate` loop on one prompt."""
    start = time.perf_counter()
    request = engine.add_request(ids, params)
    while not request.output_ids:
        engine.step()
    first = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    end = time.perf_counter()
    return first - start, (len(request.output_ids) - 1) / (end - first)


async def measure_overhead(url: str, rt: Runtime, reps: int, max_tokens: int) -> Overhead:
    tok = rt.llm.tokenizer
    banned = sorted(tok.eos_ids | ({tok.eos_id} if tok.eos_id is not None else set()))
    bias = {str(t): -100 for t in banned}
    offline = LLMEngine(rt.llm.model, tok, EngineConfig(num_blocks=256))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logit_bias={t: -100.0 for t in banned})
    out = Overhead()
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for rep in range(reps + 1):  # the first repetition warms both paths up and is not counted
            messages = [{"role": "user", "content": f"Question {rep}: {TOPICS[rep % len(TOPICS)]}"}]
            body = _body("openai", messages, {"max_tokens": max_tokens, "temperature": 0, "logit_bias": bias})
            http = await stream_one(client, "openai", body)
            assert http.error is None and http.ttft_s is not None, http.error
            assert http.tokens == max_tokens, f"{http.tokens} tokens streamed, {max_tokens} asked"
            while not rt.engine.stats().idle:  # the server's engine thread sleeps before ours steps
                await asyncio.sleep(0.005)
            # Asked after the chat, so the chat's own prompt encoding was not served from /tokenize's.
            ids = (await client.post("/tokenize", json={"messages": messages})).json()["tokens"]
            ttft, decode = engine_alone(offline, ids, params)
            if rep == 0:
                continue
            out.http_ttft.append(http.ttft_s)
            out.http_decode.append((http.tokens - 1) / (http.last_s - http.first_s))
            out.engine_ttft.append(ttft)
            out.engine_decode.append(decode)
    return out


# ---- load -----------------------------------------------------------------------------------------


@dataclass
class Load:
    results: list[Result] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)  # (seconds into the load, bytes)
    elapsed_s: float = 0.0


async def client_loop(
    client: httpx.AsyncClient, index: int, deadline: float, args: argparse.Namespace, load: Load
) -> None:
    rng = random.Random(index)
    n = 0
    while time.monotonic() < deadline:
        n += 1
        api = "anthropic" if rng.random() < 0.25 else "openai"
        messages = [{"role": "user", "content": rng.choice(TOPICS)}]
        if rng.random() < 0.3:  # a follow-up turn: a shared prefix for the cache
            messages += [
                {"role": "assistant", "content": "Sure. What exactly would you like to know?"},
                {"role": "user", "content": rng.choice(TOPICS)},
            ]
        params: dict[str, Any] = {"max_tokens": rng.choice([8, 16, 24, 32, 48])}
        if rng.random() < 0.5:
            params |= {"temperature": 0.7, "top_p": 0.9}
        else:
            params["temperature"] = 0
        leave = args.leave_after if (n + index) % args.leave_every == 0 else None
        load.results.append(await stream_one(client, api, _body(api, messages, params), leave))


async def run_load(url: str, args: argparse.Namespace) -> Load:
    load, process = Load(), psutil.Process()
    start = time.monotonic()
    deadline = start + args.seconds

    async def sample_rss() -> None:
        while True:
            load.rss.append((time.monotonic() - start, process.memory_info().rss))
            await asyncio.sleep(1.0)

    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        sampler = asyncio.create_task(sample_rss())
        await asyncio.gather(*(client_loop(client, i, deadline, args, load) for i in range(args.clients)))
        load.elapsed_s = time.monotonic() - start
        sampler.cancel()
    return load


def settle(rt: Runtime, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not (rt.engine.stats().idle and rt.engine.num_live() == 0) and time.monotonic() < deadline:
        time.sleep(0.02)


# ---- report ---------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def report(args: argparse.Namespace, rt: Runtime, overhead: Overhead, load: Load, num_blocks: int) -> bool:
    results = load.results
    errors = [r for r in results if r.error]
    done = [r for r in results if not r.error and not r.left_early]
    left = [r for r in results if r.left_early]
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
    tokens = sum(r.tokens for r in results if not r.error)
    stats = rt.engine.stats()
    after = [rss for t, rss in load.rss if t >= args.warmup_seconds] or [rss for _, rss in load.rss]
    med = statistics.median
    http_ttft, engine_ttft = med(overhead.http_ttft), med(overhead.engine_ttft)
    http_dec, engine_dec = med(overhead.http_decode), med(overhead.engine_decode)

    print(f"\nload: {args.clients} clients for {args.seconds} s ({load.elapsed_s:.1f} s with the drain)")
    print(f"  requests completed {len(done)}, left early (aborted) {len(left)}, errors {len(errors)}")
    for r in errors[:5]:
        print(f"    error ({r.api}): {r.error}")
    print(f"  completion tokens {tokens:,}: {tokens / load.elapsed_s:.1f} tokens/s in all")
    print(f"  time to first token: p50 {pct(ttfts, 0.5):.2f} s, p99 {pct(ttfts, 0.99):.2f} s")
    print(
        f"  engine after the drain: idle {stats.idle}, live {rt.engine.num_live()}, running "
        f"{stats.num_running}, waiting {stats.num_waiting}, free or cached blocks "
        f"{stats.num_free_blocks} of {num_blocks}, preemptions {stats.num_preemptions}"
    )
    print(
        f"  RSS after {args.warmup_seconds} s of warm-up ({len(after)} samples): first {mib(after[0])}, "
        f"last {mib(after[-1])}, max {mib(max(after))} (last - first {mib(after[-1] - after[0])})"
    )
    timeline = [f"{t:.0f}s {rss / 2**20:,.0f}" for t, rss in load.rss[:: max(1, len(load.rss) // 8)]]
    print(f"  RSS timeline (MiB): {', '.join(timeline)}")
    print(f"\noverhead: one client on the idle server, median of {len(overhead.http_ttft)}")
    print(f"  TTFT over HTTP {http_ttft * 1000:.1f} ms, engine alone {engine_ttft * 1000:.1f} ms")
    diffs = sorted((h - e) * 1000 for h, e in zip(overhead.http_ttft, overhead.engine_ttft, strict=True))
    print("  paired differences (ms): " + ", ".join(f"{d:+.1f}" for d in diffs))
    print(f"  decode over HTTP {http_dec:.2f} tokens/s, engine offline {engine_dec:.2f} tokens/s")

    ok = not errors and stats.idle and stats.num_free_blocks == num_blocks and rt.engine.num_live() == 0
    rows = [
        ("requests completed / left early / errors", f"{len(done)} / {len(left)} / {len(errors)}"),
        ("tokens/s, all clients", f"{tokens / load.elapsed_s:.1f}"),
        ("TTFT p50 / p99 under load", f"{pct(ttfts, 0.5):.2f} s / {pct(ttfts, 0.99):.2f} s"),
        ("KV blocks free or cached after", f"{stats.num_free_blocks} / {num_blocks}"),
        ("RSS first / last / max", f"{mib(after[0])} / {mib(after[-1])} / {mib(max(after))}"),
        (
            "idle TTFT: HTTP / engine / overhead",
            f"{http_ttft * 1000:.1f} / {engine_ttft * 1000:.1f} / {med(diffs):+.1f} ms (paired median)",
        ),
        (
            "idle decode tok/s: HTTP / engine / ratio",
            f"{http_dec:.2f} / {engine_dec:.2f} / {http_dec / engine_dec:.3f}",
        ),
        ("verdict", "ok" if ok else "FAILED"),
    ]
    print("\n| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--leave-every", type=int, default=4, help="every n-th request leaves early")
    parser.add_argument("--leave-after", type=int, default=3, help="data lines read before leaving")
    parser.add_argument("--warmup-seconds", type=float, default=5, help="RSS samples ignored first")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--num-blocks", type=int, default=1024)
    parser.add_argument("--overhead-reps", type=int, default=5)
    parser.add_argument("--overhead-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    print(
        f"server load: {args.model}, {args.num_blocks} KV blocks; commit {commit.strip() or '?'}, torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads, {psutil.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    server = ServerConfig(model_name=MODEL_NAME)
    path = resolve_model(args.model, progress=False)
    rt = build_runtime(ModelConfig(path), EngineConfig(num_blocks=args.num_blocks), server)
    try:
        with serving(rt.app) as url:
            overhead = asyncio.run(measure_overhead(url, rt, args.overhead_reps, args.overhead_tokens))
            load = asyncio.run(run_load(url, args))
            settle(rt)
            ok = report(args, rt, overhead, load, args.num_blocks)
    finally:
        rt.close()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
