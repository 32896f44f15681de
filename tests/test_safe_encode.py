"""`encode_prompt`: special tokens only from scaffolding, and otherwise exactly `Tokenizer.encode`."""

from __future__ import annotations

import dataclasses
import random
import re
from functools import cache
from pathlib import Path

import pytest

from strata.gguf.reader import GGUFFile
from strata.prompt.chat_template import ChatTemplate
from strata.prompt.rendered import RenderedPrompt
from strata.prompt.safe_encode import EncodedPrompt, _trie_regex, encode_prompt
from strata.prompt.tokenizer import Tokenizer, byte_level_chars
from tests.test_tokenizer import CORPUS


@cache
def load(path: Path) -> tuple[Tokenizer, dict]:
    """The tokenizer and metadata of a model file, built once for all the test modules that ask."""
    metadata = dict(GGUFFile(path).metadata)
    return Tokenizer.from_gguf(metadata), metadata


@pytest.fixture(scope="module")
def qwen(qwen_path: Path) -> Tokenizer:
    return load(qwen_path)[0]


@pytest.fixture(scope="module", params=["qwen", "gemma"])
def any_model(request: pytest.FixtureRequest) -> Tokenizer:
    return load(request.getfixturevalue(f"{request.param}_path"))[0]


def nested_tokenizer() -> Tokenizer:
    """A tiny byte-level vocab whose added tokens overlap and nest ("<a>", "<a>bc", "z<a>")."""
    extra = ["ab", "Ġa", "<a>", "<a>bc", "z<a>", "<|x|>", "<|x|>y", "<|im_start|>", "<|im_end|>"]
    return Tokenizer.from_gguf(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "qwen2",
            "tokenizer.ggml.tokens": [*byte_level_chars(), *extra],
            "tokenizer.ggml.token_type": [1] * 256 + [1, 1, 3, 3, 4, 3, 4, 3, 3],
            "tokenizer.ggml.merges": ["a b", "Ġ a"],
        }
    )


def sentencepiece_tokenizer() -> Tokenizer:
    """A tiny SentencePiece vocab with a "▁" prefix: text after an added token must not get one."""
    tokens = ["<unk>", "<s>", "</s>", "▁", "h", "i", "hi", "▁hi", *(f"<0x{b:02X}>" for b in range(256))]
    return Tokenizer.from_gguf(
        {
            "tokenizer.ggml.model": "llama",
            "general.architecture": "llama",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -1.5, -0.5, *([0.0] * 256)],
            "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 1, *([6] * 256)],
            "tokenizer.ggml.unknown_token_id": 0,
        }
    )


def chatml(*contents: str, gemma: bool = False) -> RenderedPrompt:
    """User turns with the given contents (plain), then the generation prompt (Gemma's markers if asked)."""
    start, end, bot = (
        ("<start_of_turn>", "<end_of_turn>", "model")
        if gemma
        else ("<|im_start|>", "<|im_end|>", "assistant")
    )
    text, spans = "", []
    for content in contents:
        text += f"{start}user\n"
        spans.append((len(text), len(text) + len(content)))
        text += f"{content}{end}\n"
    return RenderedPrompt(f"{text}{start}{bot}\n", tuple(s for s in spans if s[0] < s[1]))


def scaffold_ids(tok: Tokenizer, prompt: RenderedPrompt) -> list[int]:
    encoded = encode_prompt(tok, prompt)
    return [i for i, plain in zip(encoded.ids, encoded.plain, strict=True) if not plain]


def test_real_render_equals_encode(qwen_path: Path) -> None:
    tok, metadata = load(qwen_path)
    template = ChatTemplate.from_gguf(metadata, tok)
    assert template is not None
    clean = [t for t in CORPUS if t and not any(s in t for s in tok.added_tokens)]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
    messages = [{"role": "system", "content": "You write code."}]
    for i, content in enumerate(clean):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": content})
    messages += [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"temp": 21}'},
    ]
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    rendered = template.render(messages, tools=[tool])
    if isinstance(rendered, RenderedPrompt):
        prompt = rendered
    else:  # the contents are unique in the text, so their spans can be found in order
        spans, at = [], 0
        for m in messages:
            if m["content"]:
                at = rendered.index(m["content"], at)
                spans.append((at, at + len(m["content"])))
                at += len(m["content"])
        prompt = RenderedPrompt(rendered, tuple(spans))
    encoded = encode_prompt(tok, prompt)
    assert list(encoded.ids) == tok.encode(prompt.text)
    render_prompt = getattr(template, "render_prompt", None)  # the renderer's own spans, where it has them
    if render_prompt is not None:
        tracked = render_prompt(messages, tools=[tool])
        assert tracked.text == prompt.text and tracked.plain
        assert encode_prompt(tok, tracked).ids == encoded.ids
    assert any(encoded.plain) and not all(encoded.plain)
    assert not any(p for i, p in zip(encoded.ids, encoded.plain, strict=True) if tok.is_special(i))
    for content in clean:
        p = chatml(content)
        assert list(encode_prompt(tok, p).ids) == tok.encode(p.text), content


def test_trusted_equals_encode(any_model: Tokenizer) -> None:
    tok = any_model
    specials = sorted(tok.added_tokens)
    rng = random.Random(0)
    texts = [*CORPUS, "".join(specials[:50]), "x" + "y".join(specials[-50:]) + "\n\n z"]
    for _ in range(200):
        parts = [rng.choice(specials) if rng.random() < 0.3 else rng.choice(CORPUS) for _ in range(6)]
        texts.append("".join(parts))
    for text in texts:
        assert list(encode_prompt(tok, RenderedPrompt.trusted(text)).ids) == tok.encode(text), text


def test_added_tokens_in_content_are_inert(any_model: Tokenizer) -> None:
    tok = any_model
    protected = set(tok.protected_tokens.values())
    assert len(tok.protected_tokens) >= 20
    gemma = "<start_of_turn>" in tok.added_tokens
    clean = chatml("Hi", "a b c", "Bye", gemma=gemma)
    for token, token_id in sorted(tok.added_tokens.items()):
        dirty = chatml("Hi", f"a{token}b {token}\n{token}", "Bye", gemma=gemma)
        encoded = encode_prompt(tok, dirty)
        assert not any(i in protected for i, p in zip(encoded.ids, encoded.plain, strict=True) if p), token
        assert (token_id in encoded.ids) == (
            token_id not in protected or token_id in scaffold_ids(tok, clean)
        )
        assert scaffold_ids(tok, dirty) == scaffold_ids(tok, clean), token
        assert tok.decode(encoded.ids) == dirty.text


def test_which_tokens_are_protected(qwen: Tokenizer, gemma_path: Path) -> None:
    # Qwen: every added token, control and user-defined ("<tool_call>") alike.
    assert qwen.protected_tokens == qwen.added_tokens and qwen.protected_tokens["<tool_call>"] == 151657
    assert 151657 not in qwen.encode("<tool_call>", parse_special=False)
    # Gemma: its newline runs are user-defined tokens, matched in content too; its markup is protected.
    gemma = load(gemma_path)[0]
    assert "\n" in gemma.added_tokens and "\n" not in gemma.protected_tokens
    assert "<start_of_image>" in gemma.protected_tokens and "<table>" in gemma.protected_tokens
    encoded = encode_prompt(gemma, RenderedPrompt.untrusted("a\n\nb<start_of_image>"))
    assert (
        gemma.added_tokens["\n\n"] in encoded.ids
        and gemma.added_tokens["<start_of_image>"] not in encoded.ids
    )
    assert all(encoded.plain)


def test_special_split_across_plain_boundary(qwen: Tokenizer) -> None:
    start = qwen.added_tokens["<|im_start|>"]
    for plain in ((0, 8), (8, 12)):  # "<|im_sta" plain + "rt|>" scaffold, and the reverse
        encoded = encode_prompt(qwen, RenderedPrompt("<|im_start|>user\n", (plain,)))
        assert start not in encoded.ids and qwen.decode(encoded.ids) == "<|im_start|>user\n"
        assert encoded.plain[0] == (plain == (0, 8)) and any(encoded.plain)
    assert encode_prompt(qwen, RenderedPrompt("<|im_start|>user\n", ((12, 16),))).ids[0] == start
    # A special that lies entirely inside a plain span is inert even in the middle of scaffolding.
    text = "x<|im_end|>y"
    assert qwen.added_tokens["<|im_end|>"] not in encode_prompt(qwen, RenderedPrompt(text, ((1, 11),))).ids


def test_content_cannot_suppress_scaffolding_matches() -> None:
    tok = nested_tokenizer()
    a, abc, za = (tok.added_tokens[t] for t in ("<a>", "<a>bc", "z<a>"))
    # Longest-first would take "<a>bc" or "z<a>" across the boundary; the scaffold's "<a>" stands.
    assert encode_prompt(tok, RenderedPrompt("<a>bc", ((3, 5),))).ids[0] == a
    assert encode_prompt(tok, RenderedPrompt("z<a>", ((0, 1),))).ids[-1] == a
    assert encode_prompt(tok, RenderedPrompt.trusted("<a>bc z<a> <a>b")).ids[::2] == (abc, za, a)
    assert list(encode_prompt(tok, RenderedPrompt.trusted("z<a>bc")).ids) == tok.encode("z<a>bc")


def test_trie_regex_is_leftmost_longest() -> None:
    words = ["<a>", "<a>bc", "z<a>", "<", "<ab", "b", "bcd", "|x|"]
    pattern = re.compile(_trie_regex(words))
    rng = random.Random(1)
    for _ in range(2000):
        text = "".join(rng.choice("<>abcdz|x ") for _ in range(rng.randrange(30)))
        want, at = [], 0
        while at < len(text):
            found = [w for w in words if text.startswith(w, at)]
            if found:
                word = max(found, key=len)
                want.append((at, at + len(word)))
                at += len(word)
            else:
                at += 1
        assert [m.span() for m in pattern.finditer(text)] == want, text


def test_text_after_an_added_token_gets_no_space_prefix() -> None:
    tok = sentencepiece_tokenizer()
    for text in ["hi<s>hi", "<s>hi hi</s>hi", "hi", " hi<s> hi", "<s>"]:
        assert list(encode_prompt(tok, RenderedPrompt.trusted(text)).ids) == tok.encode(text), text
    inert = encode_prompt(tok, RenderedPrompt("hi<s>hi", ((2, 5),)))
    assert list(inert.ids) == tok.encode("hi<s>hi", parse_special=False)


def test_plain_flags_follow_the_characters(qwen: Tokenizer) -> None:
    """Each token's plain flag against the characters its bytes come from (no HF offsets involved)."""
    rng = random.Random(2)
    pieces = [*CORPUS, "<|im_start|>", "<|im_sta", "rt|>", "<tool_call>", "👨‍👩‍👧", " ", "\n\n"]
    for _ in range(300):
        text, spans = "", []
        for _ in range(rng.randrange(1, 6)):
            piece = rng.choice(pieces)
            if rng.random() < 0.5 and piece:
                spans.append((len(text), len(text) + len(piece)))
            text += piece
        merged = tuple(spans)
        encoded = encode_prompt(qwen, RenderedPrompt(text, merged))
        marks = [any(a <= c < b for a, b in merged) for c in range(len(text))]
        char_of_byte = [c for c, ch in enumerate(text) for _ in ch.encode()]
        at = 0
        for token_id, plain in zip(encoded.ids, encoded.plain, strict=True):
            n = len(qwen.token_bytes(token_id))
            chars = set(char_of_byte[at : at + n])
            assert plain == any(marks[c] for c in chars), (text, merged, token_id)
            at += n
        assert at == len(char_of_byte)


def test_encoded_prompt_is_immutable(qwen: Tokenizer) -> None:
    encoded = encode_prompt(qwen, chatml("hello"))
    assert isinstance(encoded.ids, tuple) and isinstance(encoded.plain, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        encoded.ids = ()  # type: ignore[misc]
    assert encoded == EncodedPrompt(encoded.ids, encoded.plain, reused=5)  # `reused` is not compared
