"""`StreamDecoder`: generated token ids to text, one token at a time, never half a character."""

from __future__ import annotations

import codecs

from strata.prompt.tokenizer import Tokenizer


class StreamDecoder:
    """Turns token ids, one at a time, into text as soon as it is complete.

    A character split over several byte tokens is held back until its last byte arrives, so no
    chunk ever carries half of it. The chunks from `push`, followed by `flush`, concatenate to
    exactly `tokenizer.decode(ids, skip_special)`.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_pending = tokenizer.strips_leading_space

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly "")."""
        if self._skip_special and self._tokenizer.is_special(token_id):
            return ""
        return self._emit(self._utf8.decode(self._tokenizer.token_bytes(token_id)))

    def flush(self) -> str:
        """End of sequence: return whatever is held back (incomplete bytes become U+FFFD)."""
        return self._emit(self._utf8.decode(b"", final=True))

    def _emit(self, text: str) -> str:
        if self._strip_pending and text:
            self._strip_pending = False
            if text.startswith(" "):
                text = text[1:]
        return text
