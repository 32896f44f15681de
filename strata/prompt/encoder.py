"""`PromptEncoder`: `encode_prompt`, made incremental for conversations that are resent every turn.

Agent clients send the whole conversation each turn, so a new prompt mostly repeats a recent one. The
encoder keeps the last few encoded prompts and, for a new one, reuses the tokens of the kept prompt
that agrees with it longest, encoding only the rest. The result is always exactly `encode_prompt`'s.

Where it restarts (why this is exact): let d be the length of the common prefix of the old and new
text, cut back to the first character whose plain mark differs, and L the length of the longest
protected token. The restart point r is the end of a scaffolding match of the old prompt with
r <= d - L. The scan of a scaffolding run is leftmost-longest and a match has at most L characters, so
every candidate the scan weighs before moving past r starts before r and ends before d, inside the
shared prefix, where both texts and their plain marks agree: the new prompt has the same matches up
to r, including the one ending at r. Matches are hard boundaries (each piece between them is encoded
on its own), so the tokens before r are the old ones, and the scan resumes at r exactly as a fresh
scan of text[r:] would. Pieces keep knowing whether they start the prompt (r > 0 never does).
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, replace

from strata.prompt.rendered import RenderedPrompt
from strata.prompt.safe_encode import EncodedPrompt, encode_from, scanner_for
from strata.prompt.tokenizer import Tokenizer

MAX_KEEP = 16


@dataclass(frozen=True)
class _Entry:
    text: str
    plain: tuple[tuple[int, int], ...]
    encoded: EncodedPrompt
    bounds: tuple[int, ...]  # end offset of each scaffolding match, ascending
    counts: tuple[int, ...]  # tokens up to and including that match


@dataclass
class EncoderStats:
    """Counters since the encoder was made: prompts encoded whole, prompts that reused a kept prefix,
    and the tokens reused and freshly encoded over all of them."""

    full: int = 0
    reused: int = 0
    reused_tokens: int = 0
    encoded_tokens: int = 0


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b`, copying about one string's worth at most."""
    if len(a) > len(b):
        a, b = b, a
    if b.startswith(a):
        return len(a)
    lo, hi = 0, len(a) - 1  # the answer lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if b.startswith(a[lo:mid], lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _plain_agreement(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> int | None:
    """A position before which both span lists mark the same characters plain (None: everywhere).

    Never past the first difference; it may stop early where one list splits a span the other
    keeps whole, which only costs reuse.
    """
    m = min(len(a), len(b))
    i = m if a[:m] == b[:m] else next((j for j in range(m) if a[j] != b[j]), m)
    if i < len(a) and i < len(b):
        (s1, e1), (s2, e2) = a[i], b[i]
        return min(s1, s2) if s1 != s2 else min(e1, e2)
    if i < len(a):
        return a[i][0]
    if i < len(b):
        return b[i][0]
    return None


def _agreement(entry: _Entry, text: str, plain: tuple[tuple[int, int], ...]) -> int:
    d = _common_prefix(entry.text, text)
    marks = _plain_agreement(entry.plain, plain)
    return d if marks is None else min(d, marks)


class PromptEncoder:
    """Encodes prompts exactly as `encode_prompt` does, reusing the tokens of recently kept ones.

    keep: how many encoded prompts to keep, least recently stored dropped first; 1 to 16 (the call
    site passes min(conversation slots, 16)). Thread-safe: the encoding itself runs outside the lock,
    so a race between threads may cost reuse, never correctness.
    """

    def __init__(self, tokenizer: Tokenizer, keep: int = 4) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= MAX_KEEP:
            raise ValueError(f"keep must be an integer from 1 to {MAX_KEEP}, got {keep!r}")
        self._tokenizer = tokenizer
        self._keep = keep
        self._margin = scanner_for(tokenizer).max_len
        self._entries: list[_Entry] = []  # least recently stored first
        self._stats = EncoderStats()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """How many prompts are kept."""
        return len(self._entries)

    @property
    def stats(self) -> EncoderStats:
        """A snapshot of the counters."""
        with self._lock:
            return replace(self._stats)

    def encode(self, prompt: RenderedPrompt, store: bool = True) -> EncodedPrompt:
        """`encode_prompt(tokenizer, prompt)`, reusing a kept prompt's tokens where that is exact.

        store: keep the result for later prompts (as the most recent). False leaves the kept prompts
        and their order untouched.
        """
        text, plain = prompt.text, tuple(prompt.plain)
        with self._lock:
            candidates = list(self._entries)
        same = next((e for e in candidates if e.text == text and e.plain == plain), None)
        if same is not None:
            entry, encoded = same, replace(same.encoded, reused=len(same.encoded.ids))
        else:
            entry = self._extend(self._restart_point(candidates, text, plain), text, plain)
            encoded = entry.encoded

        with self._lock:
            if encoded.reused:
                self._stats.reused += 1
            else:
                self._stats.full += 1
            self._stats.reused_tokens += encoded.reused
            self._stats.encoded_tokens += len(encoded.ids) - encoded.reused
            if store:
                self._store(entry)
        return encoded

    def forget(self, ids: Sequence[int]) -> bool:
        """Drop the kept prompt whose ids equal `ids`; True if there was one."""
        target = tuple(ids)
        with self._lock:
            kept = [e for e in self._entries if e.encoded.ids != target]
            dropped = len(kept) < len(self._entries)
            self._entries = kept
        return dropped

    def _restart_point(
        self, candidates: list[_Entry], text: str, plain: tuple[tuple[int, int], ...]
    ) -> tuple[_Entry, int] | None:
        """The kept entry and index of its match to restart after, the latest one that is safe."""
        best: tuple[_Entry, int] | None = None
        for entry in candidates:
            i = bisect_right(entry.bounds, _agreement(entry, text, plain) - self._margin) - 1
            if i >= 0 and (best is None or entry.bounds[i] > best[0].bounds[best[1]]):
                best = entry, i
        return best

    def _extend(
        self, restart: tuple[_Entry, int] | None, text: str, plain: tuple[tuple[int, int], ...]
    ) -> _Entry:
        """The entry for `text`: the restart entry's tokens up to its match, then the rest encoded."""
        if restart is None:
            ids, flags, matches = encode_from(self._tokenizer, text, plain)
            return _Entry(
                text,
                plain,
                EncodedPrompt(tuple(ids), tuple(flags)),
                tuple(end for end, _ in matches),
                tuple(count for _, count in matches),
            )
        base, at = restart
        k = base.counts[at]
        ids, flags, matches = encode_from(self._tokenizer, text, plain, base.bounds[at])
        return _Entry(
            text,
            plain,
            EncodedPrompt(base.encoded.ids[:k] + tuple(ids), base.encoded.plain[:k] + tuple(flags), k),
            base.bounds[: at + 1] + tuple(end for end, _ in matches),
            base.counts[: at + 1] + tuple(k + count for _, count in matches),
        )

    def _store(self, entry: _Entry) -> None:
        # A kept prompt that the new one extends (same text and plain marks up to its end) can never
        # offer a later restart point that the new one lacks, so it only takes up a slot.
        kept = [e for e in self._entries if _agreement(e, entry.text, entry.plain) < len(e.text)]
        kept.append(entry)
        self._entries = kept[-self._keep :]
