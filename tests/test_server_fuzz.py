"""Fuzzing every route of the server's own OpenAPI schema with schemathesis: no case may get a 5xx.

The server runs on loopback over a tiny synthetic model (byte vocabulary, ChatML template, a 128-token
context), so a generated request finishes in milliseconds however large its max_tokens. Each route gets
cases that fit its schema (positive), cases that break it (negative, for routes that take input) and,
for the generating routes, "grounded" cases: a positive body with a well-formed conversation, so that
most of them get past validation into the engine. A streamed reply must not carry an in-stream server
error either. Afterwards the server must still answer /health and an ordinary chat, with every KV
block back.

schemathesis's pytest integration (`schema.parametrize()`) does not run under pytest 9 (it sets
`Function._nodeid`), so the cases come from its Hypothesis strategies, one `@given` run per route and
mode. Cases are derandomized (the same ones every run) and not shrunk: a request that kills the
engine loop makes every later case fail, so the report names the case before the first failure too.
What the fuzz found with random seeds is pinned below as cases of its own.
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from strata.engine.llm import ModelConfig
from strata.engine.llm_engine import EngineConfig
from strata.gguf.synth import SynthSpec, write_synthetic
from strata.server.config import ServerConfig
from strata.server.runtime import Runtime, build_runtime
from tests.live_server import serving

MAX_EXAMPLES = 50  # per route and mode: about 800 cases, ~50 s on two cores beside another worker
NUM_BLOCKS = 64
# A stream that started with 200 and then failed says so inside it (OpenAI's shape, then Anthropic's).
_IN_STREAM_ERROR = re.compile(r'"type":\s*"(server_error|api_error)"')
HELLO = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}


def _runtime(path: Path) -> Runtime:
    return build_runtime(
        ModelConfig(path, chat_template="chatml"),
        EngineConfig(num_blocks=NUM_BLOCKS, block_size=16),
        ServerConfig(model_name="synth"),
    )


@pytest.fixture(scope="module")
def synth_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    spec = SynthSpec("qwen2", context_length=128)
    path = write_synthetic(tmp_path_factory.mktemp("fuzz") / "qwen2.gguf", spec)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the model is tiny; more threads only contend with the HTTP side
    yield path
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def synth_runtime(synth_path: Path) -> Iterator[Runtime]:
    rt = _runtime(synth_path)
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def synth_url(synth_runtime: Runtime) -> Iterator[str]:
    with serving(synth_runtime.app) as url:
        yield url


# ---- grounded cases -------------------------------------------------------------------------------

_TEXT = st.text(max_size=40)
_TEXT_BLOCK = st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT})
_OPENAI_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": _TEXT}
)
_ANTHROPIC_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]), "content": _TEXT | st.lists(_TEXT_BLOCK, max_size=2)}
)
_USER_LAST = [{"role": "user", "content": "hi"}]
_OPENAI_CHAT = st.lists(_OPENAI_MESSAGE, max_size=3).map(lambda m: m + _USER_LAST)
_ANTHROPIC_CHAT = st.lists(_ANTHROPIC_MESSAGE, max_size=3).map(lambda m: m + _USER_LAST)
_GROUNDS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "POST /v1/chat/completions": st.fixed_dictionaries({"messages": _OPENAI_CHAT}),
    "POST /v1/completions": st.fixed_dictionaries({"prompt": st.text(min_size=1, max_size=40)}),
    "POST /v1/messages": st.fixed_dictionaries(
        {"model": st.just("synth"), "messages": _ANTHROPIC_CHAT, "max_tokens": st.integers(1, 300)}
    ),
    "POST /v1/messages/count_tokens": st.fixed_dictionaries(
        {"model": st.just("synth"), "messages": _ANTHROPIC_CHAT}
    ),
}


def _grounded(operation: schemathesis.APIOperation) -> st.SearchStrategy[schemathesis.Case]:
    """A positive case keeping at most three of its fields, over a well-formed conversation."""

    @st.composite
    def cases(draw: st.DrawFn) -> schemathesis.Case:
        case = draw(operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
        body = case.body if isinstance(case.body, dict) else {}
        keep = draw(st.sets(st.sampled_from(sorted(body)), max_size=3)) if body else set()
        case.body = {k: body[k] for k in keep} | draw(_GROUNDS[operation.label])
        return case

    return cases()


# ---- the fuzz -------------------------------------------------------------------------------------


def _takes_input(operation: schemathesis.APIOperation) -> bool:
    return bool(operation.body) or any(True for _ in operation.iter_parameters())


@dataclass
class _Fuzz:
    base_url: str
    runtime: Runtime
    previous: str = "(none)"  # the last case sent, in case it is what broke the server
    failures: list[str] = field(default_factory=list)

    def run(self, operation: schemathesis.APIOperation, mode: str) -> collections.Counter[int]:
        """One route in one mode: the statuses seen; a failure is recorded, and ends the run."""
        statuses: collections.Counter[int] = collections.Counter()
        first: list[str] = []  # the first failure: Hypothesis replays the failing case once more
        strategy = (
            _grounded(operation)
            if mode == "grounded"
            else operation.as_strategy(generation_mode=GenerationMode(mode))
        )

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=[hypothesis.Phase.generate],
            derandomize=True,  # the same cases every run: CI fails on a change, not on luck
            print_blob=False,
        )
        @given(case=strategy)
        def run(case: schemathesis.Case) -> None:
            response = case.call(base_url=self.base_url, timeout=30)
            statuses[response.status_code] += 1
            text = response.content.decode("utf-8", "replace")
            repro, previous = case.as_curl_command(base_url=self.base_url), self.previous
            self.previous = repro
            if response.status_code >= 500 or _IN_STREAM_ERROR.search(text) or not self.engine_alive:
                first[:] = first or [
                    f"{response.status_code} for\n  {repro}\n  answer: {text[-300:]}\n"
                    f"  engine loop alive: {self.engine_alive}; the case before: {previous}"
                ]
                raise AssertionError(first[0])

        try:
            run()
        except AssertionError as e:
            self.failures.append(f"{operation.label} ({mode}): {e}")
        return statuses

    @property
    def engine_alive(self) -> bool:
        return self.runtime.engine.is_running


def test_no_case_gets_a_server_error(synth_url: str, synth_runtime: Runtime) -> None:
    config = schemathesis.Config.from_dict({"output": {"sanitization": {"enabled": False}}})
    schema = schemathesis.openapi.from_url(f"{synth_url}/openapi.json", config=config)
    fuzz, start, total = _Fuzz(synth_url, synth_runtime), time.monotonic(), 0
    for result in schema.get_all_operations():
        if not fuzz.engine_alive:  # every later case would fail too; the first failure says why
            break
        assert isinstance(result, Ok), f"the server's own schema is invalid: {result}"
        operation = result.ok()
        modes = ["positive"] + ["negative"] * _takes_input(operation)
        modes += ["grounded"] * (operation.label in _GROUNDS)
        for mode in modes:
            statuses = fuzz.run(operation, mode)
            total += statuses.total()
            seen = ", ".join(f"{n} x {code}" for code, n in sorted(statuses.items()))
            print(f"  {statuses.total():4d} {mode:8s} {operation.label:32s} {seen}")
    print(f"schemathesis ran {total} cases in {time.monotonic() - start:.0f} s against {synth_url}")
    assert not fuzz.failures, "\n\n".join(fuzz.failures)
    assert total >= 12 * MAX_EXAMPLES  # every route and mode ran (a skipped one would fall short)

    # The server serves on: health, an ordinary chat, and every KV block back once idle.
    assert httpx.get(f"{synth_url}/health").json() == {"status": "ok"}
    reply = httpx.post(f"{synth_url}/v1/chat/completions", json=HELLO, timeout=30)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] <= 8
    deadline = time.monotonic() + 5
    while not synth_runtime.engine.stats().idle and time.monotonic() < deadline:
        time.sleep(0.02)
    assert synth_runtime.engine.stats().num_free_blocks == NUM_BLOCKS


# ---- what the fuzz found, kept as cases (each on a server of its own: they may kill it) ------------


# Both once killed the engine loop: the seed left an orphan sequence queued after manual_seed raised,
# the penalty drove logits to inf and sampling raised outside the step's error handling.
_FINDINGS = [
    (route, field, value)
    for field, value in [("seed", 2**64), ("repetition_penalty", 1e-70)]
    for route in ["/v1/chat/completions", "/v1/completions"]
]


@pytest.mark.parametrize("route, name, value", _FINDINGS)
def test_an_extreme_sampling_value_leaves_the_server_serving(
    synth_path: Path, route: str, name: str, value: object
) -> None:
    rt = _runtime(synth_path)
    try:
        with serving(rt.app) as url:
            body = {"messages": HELLO["messages"]} if route == "/v1/chat/completions" else {"prompt": "hi"}
            body |= {name: value, "max_tokens": 4, "temperature": 1.0}
            answer = httpx.post(f"{url}{route}", json=body, timeout=30)
            assert answer.status_code < 500, answer.text  # a 400 naming the field, or an answer
            reply = httpx.post(f"{url}/v1/chat/completions", json=HELLO, timeout=30)
            assert reply.status_code == 200, reply.text
    finally:
        rt.close()
