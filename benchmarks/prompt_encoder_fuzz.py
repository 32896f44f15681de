"""Fuzz `PromptEncoder.encode` against the reference `encode_prompt` on evolving conversations.

    python benchmarks/prompt_encoder_fuzz.py [--cases 30000] [--seed 0] [--model qwen2.5-coder-0.5b]
        [--max-segments 60]

Each case is one prompt of one of a few conversations that grow and change the way agent clients
resend them: turns appended, replies streamed in, edits in the middle, truncation at any character,
special tokens split across two prompts, plain marks flipped, prompts resent unchanged, `store=False`
and `forget` mixed in, with keep 1, 2 and 4. Content mixes words, code, unicode, whitespace runs and
every added-token string (whole and in parts). Prints the counts; exits 1 on any mismatch.
tests/test_prompt_encoder.py runs a short version of the same fuzz.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field

from strata.prompt.encoder import PromptEncoder
from strata.prompt.rendered import RenderedPrompt
from strata.prompt.safe_encode import encode_prompt
from strata.prompt.tokenizer import Tokenizer

WORDS = ["hello", "world", " the", "def", "return", "x", "I'm", "they'll", "café", "naïve", "12345", "3.14"]
CODE = ["def f(x):\n    return x * 2\n", "if (a < b) {\n\treturn;\n}", '{"k": [1, 2, 3]}', "a<b>c", "</div>"]
UNICODE = [
    "你好，世界",
    "こんにちは",
    "안녕",
    "👍🏽",
    "👨‍👩‍👧",
    "e\u0301",
    "مرحبا",
    "𝔘𝔫",
    "\u200b",
    "\ufeff",
    "▁",
]
SPACE = [" ", "  ", "   ", "\n", "\n\n", "\n\n\n", "\t", "\r\n", " \n", "\n ", "    \n\t"]
PUNCT = ["<", ">", "|", "<|", "|>", "_", "/", "[", "]", "!", "?", ".", ","]
ROLES = ["user", "assistant", "tool", "system"]
Segment = tuple[str, bool]  # text, plain


@dataclass
class FuzzCounts:
    cases: int = 0
    reused: int = 0
    identical: int = 0
    full: int = 0
    store_false: int = 0
    reused_tokens: int = 0
    total_tokens: int = 0
    mismatches: int = 0
    ops: dict[str, int] = field(default_factory=dict)
    first_mismatch: RenderedPrompt | None = None

    def summary(self) -> str:
        share = self.reused_tokens / max(self.total_tokens, 1)
        ops = ", ".join(f"{k} {v}" for k, v in sorted(self.ops.items()))
        return (
            f"cases {self.cases}: reused a prefix {self.reused} (resent unchanged {self.identical}), "
            f"full {self.full}, store=False {self.store_false}; tokens reused {self.reused_tokens} of "
            f"{self.total_tokens} ({share:.1%}); mismatches {self.mismatches}\nops: {ops}"
        )


class _Fuzzer:
    def __init__(self, tokenizer: Tokenizer, rng: random.Random) -> None:
        self.rng = rng
        self.specials = sorted(tokenizer.added_tokens)
        if "<|im_start|>" in tokenizer.added_tokens:
            self.start, self.end = "<|im_start|>", "<|im_end|>"
        elif "<start_of_turn>" in tokenizer.added_tokens:
            self.start, self.end = "<start_of_turn>", "<end_of_turn>"
        else:  # any two of the vocab's added tokens as turn markers
            self.start, self.end = self.specials[-1], self.specials[0]
        self.close = self.end + "\n"

    def open(self, role: str) -> str:
        return f"{self.start}{role}\n"

    def special(self) -> str:
        token = self.rng.choice(self.specials)
        roll = self.rng.random()
        if roll < 0.5 or len(token) < 2:
            return token
        cut = self.rng.randrange(1, len(token))
        return token[:cut] if roll < 0.75 else token[cut:]

    def content(self, max_parts: int = 6) -> str:
        pools = [WORDS, CODE, UNICODE, SPACE, PUNCT]
        parts = []
        for _ in range(self.rng.randrange(max_parts + 1)):
            if self.rng.random() < 0.2:
                parts.append(self.special())
            else:
                parts.append(self.rng.choice(self.rng.choice(pools)))
        return "".join(parts)

    def turn(self) -> list[Segment]:
        role = self.rng.choice(ROLES)
        return [(self.open(role), False), (self.content(), True), (self.close, False)]

    def new_conversation(self, system: str) -> list[Segment]:
        return [(self.open("system"), False), (system, True), (self.close, False)]

    def mutate(self, segs: list[Segment], pending: list[str]) -> tuple[str, list[Segment]]:
        """One change to a conversation; returns the op's name and the new segment list."""
        rng, segs = self.rng, list(segs)
        if pending:
            rest = pending.pop()
            segs.append((rest, rng.random() < 0.3))
            return "special-split-rest", segs
        roll = rng.random()
        if roll < 0.25:
            segs += self.turn()
            if rng.random() < 0.5:
                segs.append((self.open("assistant"), False))
            return "append-turn", segs
        if roll < 0.40:
            segs.append((self.content(3), True))
            if rng.random() < 0.5:
                segs.append((self.close, False))
            return "stream-reply", segs
        if roll < 0.48:
            token = rng.choice(self.specials)
            cut = rng.randrange(1, len(token)) if len(token) > 1 else 1
            segs.append((token[:cut], rng.random() < 0.2))
            pending.append(token[cut:])
            return "special-split", segs
        if roll < 0.58 and segs:
            i = rng.randrange(len(segs))
            text, plain = segs[i]
            at = rng.randrange(len(text) + 1)
            new = text[:at] + (self.content(1) if rng.random() < 0.7 else "") + text[at + rng.randrange(3) :]
            segs[i] = (new, plain)
            return "edit-middle", segs
        if roll < 0.66 and segs:
            cut = rng.randrange(sum(len(t) for t, _ in segs) + 1)
            out: list[Segment] = []
            for text, plain in segs:
                if cut <= 0:
                    break
                out.append((text[:cut], plain))
                cut -= len(text)
            return "truncate", out
        if roll < 0.72 and segs:
            return "drop-turns", segs[: rng.randrange(len(segs))]
        if roll < 0.77 and segs:
            i = rng.randrange(len(segs))
            segs[i] = (segs[i][0], not segs[i][1])
            return "flip-plain", segs
        if roll < 0.82:
            scaffold = rng.choice(["", "\n", "# Tools\n", '{"type": "function"}\n']) + self.special()
            segs.append((scaffold + rng.choice(["", "\n", " x"]), False))
            return "scaffold-special", segs
        if roll < 0.90:
            return "resend", segs
        segs.append((self.content(2), rng.random() < 0.5))
        return "append-raw", segs


def render(segs: list[Segment]) -> RenderedPrompt:
    text, spans, at = [], [], 0
    for part, plain in segs:
        if plain and part:
            spans.append((at, at + len(part)))
        text.append(part)
        at += len(part)
    return RenderedPrompt("".join(text), tuple(spans))


def run_fuzz(
    tokenizer: Tokenizer,
    cases: int,
    seed: int = 0,
    keeps: tuple[int, ...] = (1, 2, 4),
    max_segments: int = 40,
) -> FuzzCounts:
    """`cases` prompts split over encoders with each of `keeps`; compares every result exactly."""
    rng = random.Random(seed)
    fuzz = _Fuzzer(tokenizer, rng)
    counts = FuzzCounts()
    for n, keep in enumerate(keeps):
        encoder = PromptEncoder(tokenizer, keep=keep)
        systems = [fuzz.content(4) for _ in range(2)]
        convs = [fuzz.new_conversation(rng.choice(systems)) for _ in range(keep + 1)]
        pending: list[list[str]] = [[] for _ in convs]
        previous: list[tuple[int, ...]] = []
        for _ in range(cases // len(keeps) + (n < cases % len(keeps))):
            c = rng.randrange(len(convs))
            if rng.random() < 0.04 or len(convs[c]) > max_segments:
                op, convs[c], pending[c] = "new-conversation", fuzz.new_conversation(rng.choice(systems)), []
            else:
                op, convs[c] = fuzz.mutate(convs[c], pending[c])
            prompt = render(convs[c])
            store = rng.random() >= 0.15
            if previous and rng.random() < 0.03:
                encoder.forget(rng.choice(previous))
                op += "+forget"
            got = encoder.encode(prompt, store=store)
            want = encode_prompt(tokenizer, prompt)
            counts.cases += 1
            counts.ops[op] = counts.ops.get(op, 0) + 1
            counts.store_false += not store
            counts.total_tokens += len(want.ids)
            counts.reused_tokens += got.reused
            if got.reused == len(got.ids) and got.ids:
                counts.identical += 1
            if got.reused:
                counts.reused += 1
            else:
                counts.full += 1
            if got.ids != want.ids or got.plain != want.plain:
                counts.mismatches += 1
                counts.first_mismatch = counts.first_mismatch or prompt
            previous = (previous + [got.ids])[-8:]
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", type=int, default=30_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--max-segments", type=int, default=60, help="restart a conversation past this")
    args = parser.parse_args()

    from strata.gguf.reader import GGUFFile
    from strata.model_store import resolve_model

    tokenizer = Tokenizer.from_gguf(GGUFFile(resolve_model(args.model, progress=False)).metadata)
    start = time.perf_counter()
    counts = run_fuzz(tokenizer, args.cases, args.seed, max_segments=args.max_segments)
    print(f"{args.model}, seed {args.seed}, {time.perf_counter() - start:.1f} s")
    print(counts.summary())
    if counts.first_mismatch is not None:
        print(f"first mismatch: {counts.first_mismatch!r}")
    return 1 if counts.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
