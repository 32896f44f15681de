"""`PromptEncoder` reproduces `encode_prompt` exactly while reusing the tokens of kept prompts."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from benchmarks.prompt_encoder_fuzz import run_fuzz
from strata.prompt.encoder import PromptEncoder
from strata.prompt.rendered import RenderedPrompt
from strata.prompt.safe_encode import encode_prompt
from strata.prompt.tokenizer import Tokenizer
from tests.test_safe_encode import chatml, load, nested_tokenizer, sentencepiece_tokenizer


@pytest.fixture(scope="module")
def qwen(qwen_path: Path) -> Tokenizer:
    return load(qwen_path)[0]


def _check_fuzz(tok: Tokenizer, cases: int, seed: int, name: str) -> None:
    counts = run_fuzz(tok, cases, seed)
    print(f"\n{name}: {counts.summary()}")
    assert counts.mismatches == 0, counts.first_mismatch
    assert counts.cases == cases and counts.reused > cases // 3 and counts.full > cases // 10
    for op in ("append-turn", "edit-middle", "truncate", "special-split-rest", "flip-plain", "resend"):
        assert counts.ops.get(op, 0) > cases // 100, op


def test_fuzz_qwen(qwen: Tokenizer) -> None:
    _check_fuzz(qwen, 6000, 0, "qwen")


def test_fuzz_gemma(gemma_path: Path) -> None:
    _check_fuzz(load(gemma_path)[0], 1500, 1, "gemma")


def test_fuzz_nested_added_tokens() -> None:
    # "<a>", "<a>bc" and "z<a>" overlap: the one vocab here where the restart margin matters.
    _check_fuzz(nested_tokenizer(), 3000, 2, "nested")


def test_fuzz_sentencepiece_prefix_space() -> None:
    _check_fuzz(sentencepiece_tokenizer(), 1000, 3, "sentencepiece")


def test_appending_a_turn_reuses_the_conversation(qwen: Tokenizer) -> None:
    encoder = PromptEncoder(qwen)
    turns = [
        f"question {i}: what does f({i}) return?\n```py\ndef f(x):\n    return x\n```" for i in range(30)
    ]
    first = encoder.encode(chatml(*turns))
    second_prompt = chatml(*turns, "and one more")
    second = encoder.encode(second_prompt)
    assert second == encode_prompt(qwen, second_prompt)
    assert len(first.ids) - 40 < second.reused < len(first.ids)
    again = encoder.encode(chatml(*turns, "and one more"))
    assert again == second and again.reused == len(again.ids)
    stats = encoder.stats
    assert (stats.full, stats.reused, stats.reused_tokens) == (1, 2, second.reused + again.reused)
    assert len(encoder) == 2
    # A prompt that extends a kept one replaces it: the kept one could offer no restart point it lacks.
    reply = RenderedPrompt(
        again_text := second_prompt.text + "Sure.",
        (*second_prompt.plain, (len(again_text) - 5, len(again_text))),
    )
    assert encoder.encode(reply) == encode_prompt(qwen, reply) and len(encoder) == 2
    assert encoder.encode(chatml(*turns)).reused == len(first.ids)


def test_results_and_kept_prompts_are_immutable(qwen: Tokenizer) -> None:
    encoder = PromptEncoder(qwen)
    prompt = chatml("hello", "world")
    first = encoder.encode(prompt)
    assert isinstance(first.ids, tuple) and isinstance(first.plain, tuple)
    copy = list(first.ids)
    copy[:] = [0] * len(copy)
    second = encoder.encode(prompt)
    assert second.ids == first.ids == encode_prompt(qwen, prompt).ids and second.reused == len(first.ids)


def test_store_false_leaves_the_kept_prompts_alone(qwen: Tokenizer) -> None:
    encoder = PromptEncoder(qwen, keep=2)
    a, b, c = (chatml(f"conversation {x} " * 20) for x in "abc")
    encoder.encode(a)
    encoder.encode(b)
    assert encoder.encode(c, store=False).reused == 0 and len(encoder) == 2
    # Encoding `a` again without storing it does not make it the most recent: `c` evicts it.
    assert encoder.encode(a, store=False).reused == len(encode_prompt(qwen, a).ids)
    encoder.encode(c)
    assert encoder.encode(a, store=False).reused < len(encode_prompt(qwen, a).ids)
    assert encoder.encode(b, store=False).reused == len(encode_prompt(qwen, b).ids)


def test_forget(qwen: Tokenizer) -> None:
    encoder = PromptEncoder(qwen, keep=4)
    a, b = chatml("first " * 30), chatml("second " * 30)
    ids_a = encoder.encode(a).ids
    encoder.encode(b)
    assert encoder.forget(list(ids_a)) and len(encoder) == 1
    assert not encoder.forget(ids_a)
    assert encoder.encode(a).reused < len(ids_a)


@pytest.mark.parametrize("keep", [0, 17, -1, True, 2.0, "4"])
def test_keep_is_validated(qwen: Tokenizer, keep: object) -> None:
    with pytest.raises(ValueError, match="keep must be an integer from 1 to 16"):
        PromptEncoder(qwen, keep=keep)  # type: ignore[arg-type]


def test_threads_share_an_encoder(qwen: Tokenizer) -> None:
    encoder = PromptEncoder(qwen, keep=2)
    shared = [f"shared turn {i} <|im_end|> {'x' * i}" for i in range(6)]
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        turns = list(shared)
        for step in range(40):
            if rng.random() < 0.2:
                turns = turns[: rng.randrange(len(turns) + 1)]
            turns.append(f"thread {seed} step {step} {rng.choice(['<|im_sta', 'rt|>', '👍', '  '])}")
            prompt = chatml(*turns)
            if encoder.encode(prompt, store=rng.random() < 0.8) != encode_prompt(qwen, prompt):
                errors.append(prompt.text)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stats = encoder.stats
    assert stats.full + stats.reused == 160 and stats.reused > 0


def test_untrusted_and_trusted_prompts(qwen: Tokenizer) -> None:
    encoder = PromptEncoder(qwen, keep=1)
    text = "<|im_start|>user\nhi<|im_end|>\n" * 5
    for prompt in (RenderedPrompt.trusted(text), RenderedPrompt.untrusted(text), RenderedPrompt(text[:-3])):
        assert encoder.encode(prompt) == encode_prompt(qwen, prompt)
    assert list(encoder.encode(RenderedPrompt.trusted(text)).ids) == qwen.encode(text)
