"""Tokenizers built from GGUF metadata with the HF `tokenizers` library, mirroring transformers'
GGUF tokenizer (transformers/integrations/gguf/gguf_tokenizer_mapping.py), the tests' reference:

- `gpt2` vocabularies: byte-level BPE from the file's tokens and merges, split first by the regex
  named by `tokenizer.ggml.pre`.
- `llama` vocabularies (SentencePiece): BPE with byte fallback, the merges rebuilt from the
  vocabulary. Gemma files rank those merges by token position and spell multi-space tokens as real
  spaces; other files rank by score and get a `▁` prefix per `tokenizer.ggml.add_space_prefix`.

Control tokens (token_type 3) and user-defined ones (4) become added tokens, matched whole in the
text. Both kinds are *protected*: `encode(parse_special=False)` and `encode_piece` never produce them,
so untrusted text cannot spell a turn marker or Qwen's `<tool_call>`. The one exception is a
user-defined token made only of whitespace (Gemma's "\n", "\n\n", ...): it cannot forge anything,
and the model never saw newlines spelled any other way, so it is matched everywhere as ordinary
vocabulary. (If some protected token contained whitespace, the two kinds could overlap in the text,
and all user-defined tokens are protected instead.) Decoding works on bytes, so the streaming decoder
can hold back half a UTF-8 character and still agree exactly with `decode`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from functools import lru_cache
from operator import itemgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _Backend
from tokenizers.models import BPE

if TYPE_CHECKING:
    from strata.prompt.stream_decoder import StreamDecoder

_CONTROL, _USER_DEFINED = 3, 4

_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> split regex; None means ByteLevel's own GPT-2 regex.
_PRE_TOKENIZER_SPLITS: dict[str, str | None] = {
    "default": None,
    "gpt2": None,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
}
_GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3"})
# Control tokens that end a turn in some chat format; generation stops at any that the vocab has.
_END_OF_TURN = frozenset(
    {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<eot>"}
)
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def byte_level_chars() -> tuple[str, ...]:
    """GPT-2's printable stand-in for each byte value, indexed by byte."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return tuple(chars)


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable spelling of each byte, inverted: character -> byte."""
    return {c: b for b, c in enumerate(byte_level_chars())}


def _merges_from_vocab(vocab: Mapping[str, int], ranks: Mapping[str, float]) -> list[tuple[str, str]]:
    """Every split of a token into two vocab tokens, best `ranks` first (transformers' generate_merges)."""
    merges = []
    for merged, rank in ranks.items():
        local = []
        for i in range(1, len(merged)):
            left = merged[:i]
            if left in vocab and (right := merged[i:]) in vocab:
                local.append((vocab[left], vocab[right], rank, len(left), len(right), left, right))
        local.sort()
        merges.extend(local)
    merges.sort(key=itemgetter(2, 3, 4), reverse=True)
    return [(m[5], m[6]) for m in merges]


def _byte_level_backend(meta: Mapping[str, Any], tokens: list[str]) -> tuple[_Backend, set[str]]:
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZER_SPLITS:
        raise ValueError(
            f"unsupported tokenizer.ggml.pre {pre!r} for a gpt2 vocabulary; "
            f"supported: {', '.join(sorted(_PRE_TOKENIZER_SPLITS))}"
        )
    alphabet = _byte_decoder().keys()
    spelling = {b: c for c, b in _byte_decoder().items()}
    # Tokens outside the byte alphabet are respelled as their UTF-8 bytes, as transformers does.
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
        for i, t in enumerate(tokens)
    }
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", ())]
    backend = _Backend(
        BPE(vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    )
    split = _PRE_TOKENIZER_SPLITS[pre]
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    backend.decoder = decoders.ByteLevel()
    return backend, set(vocab)


def _sentencepiece_backend(
    meta: Mapping[str, Any], tokens: list[str], prefix_space: bool
) -> tuple[_Backend, set[str]]:
    gemma = meta.get("general.architecture") in _GEMMA_ARCHITECTURES
    if gemma:
        # Gemma files store a token of spaces as real spaces; the model's spelling is "▁▁...".
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    # Gemma's scores do not follow its merge order; the token order does.
    if gemma:
        ranks = {t: -i for i, t in enumerate(tokens)}
    else:
        ranks = dict(zip(tokens, meta["tokenizer.ggml.scores"], strict=True))
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else "<unk>"
    merges = _merges_from_vocab(vocab, ranks)
    backend = _Backend(BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        backend.normalizer = normalizers.Replace(" ", "▁")
        backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:
        scheme = "first" if prefix_space else "never"
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
        if prefix_space:
            steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    return backend, set(vocab)


class Tokenizer:
    """A GGUF file's tokenizer: text <-> token ids. Build it with `Tokenizer.from_gguf`."""

    def __init__(
        self,
        backend: _Backend,
        pieces: list[str],
        *,
        byte_level: bool,
        special_ids: frozenset[int],
        bos_id: int | None,
        eos_id: int | None,
        eos_ids: frozenset[int],
        add_bos: bool,
        add_eos: bool,
        strip_leading_space: bool,
        added: Mapping[str, int] | None = None,
        protected: Mapping[str, int] | None = None,
        continuation: _Backend | None = None,
    ) -> None:
        self._backend = backend
        # Encodes text that does not start the prompt, where that differs (SentencePiece's "▁" prefix).
        self._continuation = continuation
        self._added = MappingProxyType(dict(added or {}))
        self._protected = MappingProxyType(dict(protected or {}))
        self._pieces = pieces
        self._byte_level = byte_level
        self._special_ids = special_ids
        self.bos_id, self.eos_id, self.eos_ids = bos_id, eos_id, eos_ids
        self.add_bos, self.add_eos = add_bos, add_eos
        self._strip_leading_space = strip_leading_space
        self._bytes_cache: dict[int, bytes] = {}
        # `encode_special_tokens` is a flag on the shared backend, so flipping it must not race.
        self._lock = threading.Lock()

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build the tokenizer that a GGUF file's `tokenizer.ggml.*` metadata describes."""
        model = metadata.get("tokenizer.ggml.model")
        tokens = list(metadata["tokenizer.ggml.tokens"])
        types = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        prefix_space = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
        if model == "gpt2":
            backend, vocab = _byte_level_backend(metadata, tokens)
            alphabet = _byte_decoder().keys()
            # A "control" token outside the byte alphabet is a llama.cpp mislabel; transformers skips it.
            control = [i for i, t in enumerate(types) if t == _CONTROL and set(tokens[i]) <= alphabet]
            add_bos_default, strip = False, False
        elif model == "llama":
            backend, vocab = _sentencepiece_backend(metadata, tokens, prefix_space)
            control = [i for i, t in enumerate(types) if t == _CONTROL]
            gemma = metadata.get("general.architecture") in _GEMMA_ARCHITECTURES
            add_bos_default, strip = True, prefix_space and not gemma
        else:
            raise ValueError(f"unsupported tokenizer.ggml.model {model!r}; supported: 'gpt2', 'llama'")

        # Only those the (respelled) vocabulary has, as transformers does.
        user = [t for t, kind in zip(tokens, types, strict=True) if kind == _USER_DEFINED and t in vocab]
        # The backend's `special` flag means "protected" here: `encode_special_tokens` skips exactly those.
        free = [t for t in user if t.isspace()]
        protected = [tokens[i] for i in control] + [t for t in user if not t.isspace()]
        if any(c.isspace() for t in protected for c in t):
            protected, free = protected + free, []
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in protected])
        backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in free])
        added: dict[str, int] = {}
        for t in protected + free:
            if (token_id := backend.token_to_id(t)) is not None:
                added[t] = token_id
        continuation = None
        if strip:  # a SentencePiece Metaspace with the "first" prepend scheme
            # Metaspace's "first" scheme adds "▁" only to text at offset 0 of the call, so text that
            # follows an added token must be encoded by a copy that never adds it.
            continuation = _Backend.from_str(backend.to_str())
            continuation.pre_tokenizer = pre_tokenizers.Metaspace(
                replacement="▁", prepend_scheme="never", split=False
            )

        eos_id = metadata.get("tokenizer.ggml.eos_token_id")
        declared = (metadata.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom"))
        end_of_turn = {i for i in control if tokens[i] in _END_OF_TURN} | {
            int(i) for i in declared if i is not None
        }
        return cls(
            backend,
            tokens,
            byte_level=model == "gpt2",
            special_ids=frozenset(control),
            bos_id=metadata.get("tokenizer.ggml.bos_token_id"),
            eos_id=eos_id,
            eos_ids=frozenset(end_of_turn),
            add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos_default)),
            add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
            strip_leading_space=strip,
            added=added,
            protected={t: added[t] for t in protected if t in added},
            continuation=continuation,
        )

    @property
    def strips_leading_space(self) -> bool:
        """Decoding drops the space a SentencePiece prefix added before the first token."""
        return self._strip_leading_space

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    def encode(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids for `text`.

        add_special: prepend BOS (and append EOS) where the vocabulary asks for them.
        parse_special: when True, added-token strings in `text` such as "<|im_start|>" or
        "<tool_call>" become their single id. When False the protected ones (`protected_tokens`) are
        tokenized as ordinary characters, so untrusted text cannot forge turn markers or tool calls.
        Unlike llama.cpp, this covers user-defined tokens too, except whitespace-only ones.
        """
        with self._lock:
            self._backend.encode_special_tokens = not parse_special
            try:
                ids = self._backend.encode(text, add_special_tokens=False).ids
            finally:
                self._backend.encode_special_tokens = False
        if add_special:
            if self.add_bos and self.bos_id is not None:
                ids.insert(0, self.bos_id)
            if self.add_eos and self.eos_id is not None:
                ids.append(self.eos_id)
        return ids

    def encode_piece(self, text: str, *, first: bool = True) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and their [start, end) character offsets for `text` with no protected token matched.

        first: `text` starts the prompt. When False it is a piece that follows other text (an added
        token), encoded as the backend encodes such a segment of a longer text.
        """
        backend = self._backend if first or self._continuation is None else self._continuation
        with self._lock:
            backend.encode_special_tokens = True
            try:
                encoding = backend.encode(text, add_special_tokens=False)
            finally:
                backend.encode_special_tokens = False
        return encoding.ids, encoding.offsets

    @property
    def added_tokens(self) -> Mapping[str, int]:
        """Every added token (control and user-defined) the backend matches whole: text -> id."""
        return self._added

    @property
    def protected_tokens(self) -> Mapping[str, int]:
        """The added tokens that only trusted text may produce: text -> id (see the module docstring)."""
        return self._protected

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text for `ids`; invalid UTF-8 becomes U+FFFD. skip_special drops control tokens."""
        data = b"".join(self.token_bytes(i) for i in ids if not (skip_special and i in self._special_ids))
        text = data.decode("utf-8", errors="replace")
        if self._strip_leading_space and text.startswith(" "):
            text = text[1:]
        return text

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary entry for `token_id` as the GGUF file spells it (e.g. "Ġhello", "▁hello")."""
        return self._pieces[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes `token_id` contributes to decoded text."""
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        piece = self._pieces[token_id]
        if self._byte_level:
            table = _byte_decoder()
            data = bytes(table[c] for c in piece) if set(piece) <= table.keys() else piece.encode("utf-8")
        elif m := _BYTE_TOKEN.fullmatch(piece):
            data = bytes([int(m.group(1), 16)])
        else:
            data = piece.replace("▁", " ").encode("utf-8")
        self._bytes_cache[token_id] = data
        return data

    def is_special(self, token_id: int) -> bool:
        """True for control tokens (BOS, EOS, turn markers, ...), the ones `skip_special` drops."""
        return token_id in self._special_ids

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        """A fresh `StreamDecoder` for one generated sequence."""
        from strata.prompt.stream_decoder import StreamDecoder

        return StreamDecoder(self, skip_special=skip_special)
