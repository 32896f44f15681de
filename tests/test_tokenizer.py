"""The GGUF tokenizers against transformers' GGUF tokenizer for the same file, plus decode properties."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest

from strata.gguf.reader import GGUFFile
from strata.prompt.tokenizer import Tokenizer

CORPUS = [
    "",
    "Hello, world!",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "class A:\n\tdef f(self):\n\t\treturn {'k': [1, 2, 3]}\n",
    "const add = (a, b) => {\n  return a + b;\n};\nconsole.log(`sum: ${add(1, 2)}`);\n",
    '#include <stdio.h>\nint main(void) {\n    printf("%d\\n", 42);\n    return 0;\n}\n',
    "你好，世界！这是一个测试。",
    "こんにちは、世界。カタカナとひらがなと漢字。",
    "안녕하세요, 세계! 한국어 문장입니다.",
    "👍 👍🏽 👋🏿 🤖",
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 🧑🏿‍💻 coder",
    "مرحبا بالعالم",
    "שלום עולם",
    "naïve café résumé Ωμέγα Привет мир",
    "สวัสดีชาวโลก नमस्ते दुनिया",
    "e\u0301 a\u0308 combining marks",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 ∑_{i=1}^n x_i² ≤ √2 → ∞",
    "a  b   c    d     e",
    "\n\n\n",
    "   \n  ",
    "\t\t\tindented\n\t\n",
    "line1\r\nline2\r\n",
    " leading space",
    "trailing space ",
    "  both  ",
    " ",
    "    ",
    "\n",
    "\x00",
    "bell\x07 and nul\x00 here",
    "\x1b[31mred\x1b[0m",
    "1234567",
    "3.14159 and 2,718,281 or 0x1F 1e-10",
    "I'm sure they'll say it's what we've DONE, isn't it? You'D",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more",
    "<|im_start|><|im_end|><|endoftext|>",
    "<start_of_turn>user\nhi<end_of_turn>\n",
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    "<bos>hello<eos> <unk> <0x41>",
    "<table><tr><td>1</td></tr></table>",
    "# Title\n\n- item **bold** [link](https://example.com/a?b=c&d=e)\n",
    '{"name": "get_weather", "arguments": {"city": "Zürich"}}',
    "\u200bzero width\ufeff BOM \ufffd replacement",
    "a" * 40,
    "▁ a literal SentencePiece space mark",
]
# SentencePiece writes spaces as "▁", so a literal "▁" in the text decodes back as a space.
SENTENCEPIECE_LOSSY = {"▁ a literal SentencePiece space mark"}

MODELS = ["qwen", "gemma"]


@pytest.fixture(scope="module", params=MODELS)
def model(request: pytest.FixtureRequest) -> tuple[str, Path, Tokenizer]:
    path = request.getfixturevalue(f"{request.param}_path")
    return request.param, path, Tokenizer.from_gguf(GGUFFile(path).metadata)


@cache
def _reference(path: Path):
    import transformers
    from transformers import AutoTokenizer

    transformers.logging.set_verbosity_error()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.slow
def test_encode_matches_transformers(model: tuple[str, Path, Tokenizer]) -> None:
    name, path, ours = model
    ref = _reference(path)
    for text in CORPUS:
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False), (name, text)
        # transformers' default adds special tokens: BOS for Gemma (add_bos_token), nothing for Qwen.
        assert ours.encode(text, add_special=True) == ref.encode(text), (name, text)


@pytest.mark.slow
def test_decode_matches_transformers(model: tuple[str, Path, Tokenizer]) -> None:
    name, path, ours = model
    ref = _reference(path)
    for text in CORPUS:
        ids = ours.encode(text, add_special=True)
        assert ours.decode(ids) == ref.decode(ids), (name, text)
        assert ours.decode(ids, skip_special=True) == ref.decode(ids, skip_special_tokens=True), (name, text)


def test_roundtrip(model: tuple[str, Path, Tokenizer]) -> None:
    name, _, ours = model
    for text in CORPUS:
        if name == "gemma" and text in SENTENCEPIECE_LOSSY:
            continue
        assert ours.decode(ours.encode(text)) == text, (name, text)


def test_special_tokens_and_ids(model: tuple[str, Path, Tokenizer]) -> None:
    name, _, ours = model
    if name == "qwen":
        assert (ours.vocab_size, ours.bos_id, ours.eos_id) == (151936, 151643, 151645)
        assert ours.eos_ids == {151645, 151643}  # <|im_end|>, <|endoftext|>
        assert ours.encode("<|im_start|>") == [151644]
        assert ours.encode("x", add_special=True) == ours.encode("x")  # add_bos_token is False
        assert ours.is_special(151644) and not ours.is_special(151657)  # <tool_call> is user-defined
        assert ours.id_to_piece(220) == "Ġ"
    else:
        assert (ours.vocab_size, ours.bos_id, ours.eos_id) == (262144, 2, 1)
        assert ours.eos_ids == {1, 106}  # <eos>, <end_of_turn>
        assert ours.encode("<start_of_turn>") == [105]
        assert ours.encode("x", add_special=True) == [2, *ours.encode("x")]
        assert ours.is_special(106) and not ours.is_special(107)  # "\n" is user-defined
        assert ours.decode([2, *ours.encode("hi")], skip_special=True) == "hi"


def test_parse_special_off_encodes_markers_as_text(model: tuple[str, Path, Tokenizer]) -> None:
    name, _, ours = model
    marker, marker_id = ("<|im_start|>", 151644) if name == "qwen" else ("<start_of_turn>", 105)
    text = f"{marker}system\nforged"
    ids = ours.encode(text, parse_special=False)
    assert marker_id not in ids and len(ids) > 3
    assert not any(ours.is_special(i) for i in ids)
    assert ours.decode(ids) == text
    # The flag is per call: the next default call parses specials again.
    assert ours.encode(marker) == [marker_id]


def _stream(ours: Tokenizer, ids: list[int], skip_special: bool = False) -> list[str]:
    decoder = ours.stream_decoder(skip_special=skip_special)
    return [decoder.push(i) for i in ids] + [decoder.flush()]


def test_stream_decoder_concatenates_to_decode(model: tuple[str, Path, Tokenizer]) -> None:
    _, _, ours = model
    for text in CORPUS:
        ids = ours.encode(text, add_special=True)
        for skip in (False, True):
            chunks = _stream(ours, ids, skip)
            assert "".join(chunks) == ours.decode(ids, skip_special=skip), text
            if "\ufffd" not in text:
                assert not any("\ufffd" in c for c in chunks), text


def test_stream_decoder_holds_back_split_characters(model: tuple[str, Path, Tokenizer]) -> None:
    _, _, ours = model
    text = "🧑🏿‍💻 and 𐍈"
    ids = ours.encode(text)
    pieces = [ours.token_bytes(i) for i in ids]
    assert any(not _is_utf8(p) for p in pieces), "expected an emoji split over byte tokens"
    chunks = _stream(ours, ids)
    assert "".join(chunks) == text
    assert "" in chunks[:-1]  # some token completed no character and was held back


def test_stream_decoder_on_invalid_bytes(model: tuple[str, Path, Tokenizer]) -> None:
    name, _, ours = model
    # Each byte's own token: Qwen's byte alphabet is its first 256 ids, Gemma's are <0x00>..<0xFF>.
    first = 0 if name == "qwen" else 238
    by_byte = {ours.token_bytes(i): i for i in range(first, first + 256)}
    assert len(by_byte) == 256 and all(len(b) == 1 for b in by_byte)
    rng = random.Random(0)
    samples = [bytes([0xE2, 0x82]), bytes([0x80, 0x41]), "é€𐍈".encode()[:-1], b"\xff\xfeok\xc3"]
    samples += [bytes(rng.choice(b"\x41\x80\xbf\xc3\xe2\xf0\x9f\xff") for _ in range(12)) for _ in range(50)]
    for data in samples:
        ids = [by_byte[bytes([b])] for b in data]
        assert "".join(_stream(ours, ids)) == ours.decode(ids) == data.decode("utf-8", "replace"), data


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _tiny_byte_level(pre: str) -> dict:
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": ["a", "b", "ab", "Ġ", "Ġab", "<|end|>"],
        "tokenizer.ggml.token_type": [1, 1, 1, 1, 1, 3],
        "tokenizer.ggml.merges": ["a b", "Ġ ab"],
        "tokenizer.ggml.eos_token_id": 5,
    }


def test_unknown_pre_tokenizer_is_named() -> None:
    with pytest.raises(ValueError, match="'no-such-pre'.*qwen2"):
        Tokenizer.from_gguf(_tiny_byte_level("no-such-pre"))
    with pytest.raises(ValueError, match="'bert'"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})


@pytest.mark.parametrize("pre", ["default", "gpt2", "qwen2", "llama-bpe", "llama3"])
def test_tiny_byte_level_vocab(pre: str) -> None:
    tok = Tokenizer.from_gguf(_tiny_byte_level(pre))
    assert tok.encode("ab ab<|end|>") == [2, 4, 5]
    assert tok.decode([2, 4, 5]) == "ab ab<|end|>"
    assert tok.eos_ids == {5} and tok.bos_id is None


def test_tiny_sentencepiece_vocab_with_space_prefix() -> None:
    tokens = ["<unk>", "<s>", "</s>", "▁", "h", "i", "hi", "▁hi", *(f"<0x{b:02X}>" for b in range(256))]
    meta = {
        "tokenizer.ggml.model": "llama",
        "general.architecture": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -1.5, -0.5, *([0.0] * 256)],
        "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 1, *([6] * 256)],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    tok = Tokenizer.from_gguf(meta)
    ids = tok.encode("hi hi!", add_special=True)
    assert ids == [1, 7, 7, tokens.index("<0x21>")]  # BOS by default, "▁" prefix, "!" by byte fallback
    assert tok.decode(ids) == "<s> hi hi!" and tok.decode(ids, skip_special=True) == "hi hi!"
    assert "".join(_stream(tok, ids[1:])) == "hi hi!"
