"""How much `PromptEncoder` saves when a long conversation is resent with one more turn.

    python benchmarks/prompt_encoder_speed.py [--tokens 100000] [--repeats 7] [--model qwen2.5-coder-0.5b]

Builds a ChatML conversation of about `--tokens` tokens (many turns of prose, code and unicode),
encodes its prompt (ending in the generation prompt) with a fresh `PromptEncoder`, then times the
next request: the same conversation plus the model's ~50-token reply and a ~50-token user turn.
Compares that with a full `encode_prompt` and with plain `Tokenizer.encode` of the text (no spans);
asserts identical ids and prints medians over `--repeats` runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable

from strata.gguf.reader import GGUFFile
from strata.model_store import resolve_model
from strata.prompt.encoder import PromptEncoder
from strata.prompt.rendered import RenderedPrompt
from strata.prompt.safe_encode import encode_prompt
from strata.prompt.tokenizer import Tokenizer

PARAGRAPHS = [
    "The quick brown fox jumps over the lazy dog while the committee reviews the quarterly report. ",
    "def merge(a: list[int], b: list[int]) -> list[int]:\n    out, i, j = [], 0, 0\n"
    "    while i < len(a) and j < len(b):\n        out.append(min(a[i], b[j]))\n",
    'Error: {"code": 404, "message": "not found", "path": "/api/v1/items/42"}\n',
    "Les données sont stockées dans un cache — 数据存储在缓存中。 キャッシュ 👍🏽\n",
    "| name | value |\n|------|-------|\n| alpha | 0.25 |\n| beta | 1e-3 |\n",
    "    for (int k = 0; k < n; ++k) {\n        sum += x[k] * w[k];\n    }\n",
]


def render(turns: list[tuple[str, str]]) -> RenderedPrompt:
    """ChatML with each content as a plain span, ending in the generation prompt."""
    text, spans = "", []
    for role, content in turns:
        text += f"<|im_start|>{role}\n"
        spans.append((len(text), len(text) + len(content)))
        text += f"{content}<|im_end|>\n"
    return RenderedPrompt(text + "<|im_start|>assistant\n", tuple(spans))


def conversation(tokenizer: Tokenizer, tokens: int, rng: random.Random) -> list[tuple[str, str]]:
    turns: list[tuple[str, str]] = [("system", "You are a careful coding assistant.")]
    roles = ["user", "assistant", "tool", "assistant"]
    total = 0
    while total < tokens:
        content = "".join(rng.choice(PARAGRAPHS) for _ in range(rng.randrange(2, 8)))
        turns.append((roles[len(turns) % len(roles)], content))
        total += len(tokenizer.encode(content)) + 5
    return turns


def median_time(fn: Callable[[], object], repeats: int, setup: Callable[[], None] | None = None) -> float:
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    args = parser.parse_args()

    tokenizer = Tokenizer.from_gguf(GGUFFile(resolve_model(args.model, progress=False)).metadata)
    rng = random.Random(0)
    turns = conversation(tokenizer, args.tokens, rng)
    before = render(turns)
    reply = ("assistant", "Sure: use `merge(a, b)` from above; it runs in O(n + m) and keeps the order. " * 2)
    question = (
        "user",
        "Thanks! Now make it generic over any comparable type, and add a docstring with an example.",
    )
    after = render([*turns, reply, question])
    want = encode_prompt(tokenizer, after)
    assert after.text.startswith(before.text)

    encoder = PromptEncoder(tokenizer)
    got = [encoder.encode(after)]

    def fresh() -> None:
        nonlocal encoder
        encoder = PromptEncoder(tokenizer)
        encoder.encode(before)

    full = median_time(lambda: encode_prompt(tokenizer, after), args.repeats)
    raw = median_time(lambda: tokenizer.encode(after.text), args.repeats)
    incremental = median_time(lambda: got.append(encoder.encode(after)), args.repeats, setup=fresh)
    assert all(g == want for g in got), "PromptEncoder disagrees with encode_prompt"
    assert list(want.ids) == tokenizer.encode(after.text)
    last = got[-1]
    print(
        f"{args.model}: {len(turns)} turns, {len(before.text)} chars; new prompt {len(want.ids)} tokens, "
        f"{len(want.ids) - last.reused} encoded afresh, {last.reused} reused"
    )
    print(f"full encode_prompt      {full * 1e3:8.2f} ms")
    print(f"Tokenizer.encode (raw)  {raw * 1e3:8.2f} ms")
    print(f"PromptEncoder.encode    {incremental * 1e3:8.2f} ms")
    print(
        f"speed-up: {full / incremental:.1f}x over encode_prompt, {raw / incremental:.1f}x over plain encode"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
