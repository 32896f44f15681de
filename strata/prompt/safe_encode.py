"""Encoding a `RenderedPrompt` so that special tokens come only from the template's scaffolding.

The definition (`encode_prompt`, the reference that `PromptEncoder` must reproduce exactly):

1. Each maximal run of scaffolding (the characters outside `prompt.plain`) is scanned on its own for
   the tokenizer's protected added tokens (`Tokenizer.protected_tokens`: control tokens such as
   `<|im_start|>` and user-defined ones such as `<tool_call>`), the way the HF backend splits text on
   added tokens: the leftmost match first, the longest one at that position, no overlaps. So a match
   lies entirely inside scaffolding, and the content next to it cannot change which ones are found.
2. Each match becomes its id. Every stretch of text between two matches (or an end of the prompt) is
   encoded as ONE piece with no protected token matched at all (`Tokenizer.encode_piece`), plain and
   scaffolding characters alike: a `<|im_end|>` or `<tool_call>` typed by a user becomes ordinary
   characters, and BPE works across plain/scaffold boundaries exactly as in one undivided text.
3. A token is plain when its character range overlaps a plain span (straddling tokens count as plain).

Whitespace-only user-defined tokens (Gemma's "\\n") are not protected: the backend matches them inside
pieces as ordinary vocabulary. When no occurrence of a protected token, as the backend's own scan of
the whole text finds them, overlaps a plain span, the ids are exactly `tokenizer.encode(prompt.text)`.
"""

from __future__ import annotations

import re
import threading
import weakref
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from strata.prompt.rendered import RenderedPrompt
from strata.prompt.tokenizer import Tokenizer


@dataclass(frozen=True)
class EncodedPrompt:
    """A prompt's token ids, and per token whether it came (wholly or partly) from plain text."""

    ids: tuple[int, ...]
    plain: tuple[bool, ...]
    # How many leading ids `PromptEncoder` took from a kept prompt (0 for a full encode); not compared.
    reused: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Scanner:
    """Finds a tokenizer's protected tokens in trusted text (leftmost, then longest)."""

    pattern: re.Pattern[str] | None
    ids: Mapping[str, int]
    max_len: int


def _trie_regex(words: Iterable[str]) -> str:
    """One regex for `words` that matches, at a position, the longest of them that fits there.

    A trie keeps the alternation small for vocabularies with thousands of added tokens; at each node
    the longer continuations are tried before stopping, which gives longest-first.
    """
    root: dict[str, dict] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict[str, dict]) -> str:
        alts = [re.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return build(root)


_scanners: weakref.WeakKeyDictionary[Tokenizer, Scanner] = weakref.WeakKeyDictionary()
_scanners_lock = threading.Lock()


def scanner_for(tokenizer: Tokenizer) -> Scanner:
    """The (cached) scanner for `tokenizer`'s protected tokens."""
    with _scanners_lock:
        found = _scanners.get(tokenizer)
    if found is not None:
        return found
    ids = {t: i for t, i in tokenizer.protected_tokens.items() if t}
    pattern = re.compile(_trie_regex(ids)) if ids else None
    built = Scanner(pattern, ids, max((len(t) for t in ids), default=0))
    with _scanners_lock:
        return _scanners.setdefault(tokenizer, built)


def _plain_flags(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[bool]:
    """Per token, whether its [start, end) offsets overlap one of `spans` (sorted, disjoint)."""
    if len(spans) == 1:
        lo, hi = spans[0]
        return [end > lo and start < hi for start, end in offsets]
    ends = [end for _, end in spans]
    flags = []
    for start, end in offsets:
        # The first span ending after the token starts is the only one that can overlap it.
        i = bisect_right(ends, start)
        flags.append(i < len(spans) and spans[i][0] < end)
    return flags


def encode_from(
    tokenizer: Tokenizer, text: str, plain: Sequence[tuple[int, int]], start: int = 0
) -> tuple[list[int], list[bool], list[tuple[int, int]]]:
    """`encode_prompt`'s tokens for `text[start:]`, where `start` is 0 or the end of a scaffolding match.

    Returns the ids, their plain flags and, for each protected-token match, (its end offset in `text`,
    the number of returned tokens up to and including it).
    """
    scanner = scanner_for(tokenizer)
    n = len(text)
    spans = [(a, b) for a, b in plain if b > start]
    matches: list[re.Match[str]] = []
    if scanner.pattern is not None:
        pos = start
        for a, b in [*spans, (n, n)]:
            if a > pos:
                matches.extend(scanner.pattern.finditer(text, pos, a))
            pos = max(pos, b)

    ids: list[int] = []
    flags: list[bool] = []
    bounds: list[tuple[int, int]] = []
    span_ends = [b for _, b in spans]

    def piece(p: int, q: int) -> None:
        piece_ids, offsets = tokenizer.encode_piece(text[p:q], first=p == 0)
        i = bisect_right(span_ends, p)
        local = []
        while i < len(spans) and spans[i][0] < q:
            local.append((max(spans[i][0], p) - p, min(spans[i][1], q) - p))
            i += 1
        ids.extend(piece_ids)
        if not local or local == [(0, q - p)]:
            flags.extend([bool(local)] * len(piece_ids))
        else:
            flags.extend(_plain_flags(offsets, local))

    at = start
    for m in matches:
        s, e = m.span()
        if s > at:
            piece(at, s)
        ids.append(scanner.ids[m.group()])
        flags.append(False)
        bounds.append((e, len(ids)))
        at = e
    if n > at:
        piece(at, n)
    return ids, flags, bounds


def encode_prompt(tokenizer: Tokenizer, prompt: RenderedPrompt) -> EncodedPrompt:
    """Encode `prompt` so that only its scaffolding can produce protected tokens (module docstring)."""
    ids, flags, _ = encode_from(tokenizer, prompt.text, prompt.plain)
    return EncodedPrompt(tuple(ids), tuple(flags))
