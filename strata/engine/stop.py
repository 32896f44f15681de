"""`StopChecker`: one sequence's generated tokens to text, ending at a stop string or a stop token.

Text is held back while it could still be the start of a stop string, so a stop string split over
several tokens is never partly emitted; the `StreamDecoder` underneath already holds back incomplete
UTF-8, so no chunk carries half a character either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from strata.engine.sampler import SamplingParams
from strata.prompt.stream_decoder import StreamDecoder
from strata.prompt.tokenizer import Tokenizer


@dataclass(frozen=True)
class StopResult:
    """What one pushed token produced.

    text: the new text that is safe to show (possibly ""). finished: the sequence is over; when a
    stop string ended it, `matched` is that string and `text` stops just before it.
    """

    text: str
    finished: bool = False
    reason: Literal["stop"] | None = None
    matched: str | None = None


class StopChecker:
    """Stop strings and stop tokens for one generated sequence; push its tokens one at a time.

    When several stop strings occur in the text not yet emitted, the one that starts earliest wins
    (the shortest, when two start at the same place). Generation stops as soon as any stop string is
    complete; a longer stop string that started earlier and might still complete is not waited for.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        stop: Iterable[str] = (),
        stop_token_ids: Iterable[int] = (),
        eos_ids: Iterable[int] = (),
        *,
        skip_special: bool = False,
    ) -> None:
        self._stops = tuple(dict.fromkeys(s for s in stop if s))  # unique, in order
        self._stop_ids = frozenset(stop_token_ids) | frozenset(eos_ids)
        self._decoder = StreamDecoder(tokenizer, skip_special=skip_special)
        self._pending = ""  # decoded text held back: it could be the start of a stop string
        self.finished = False

    @classmethod
    def for_params(cls, tokenizer: Tokenizer, params: SamplingParams, **kwargs: bool) -> StopChecker:
        """The checker a request asks for: its stop strings and ids, plus EOS unless ignore_eos."""
        eos = () if params.ignore_eos else tokenizer.eos_ids
        return cls(tokenizer, params.stop, params.stop_token_ids, eos, **kwargs)

    def push(self, token_id: int) -> StopResult:
        """Add one generated token; return the text it releases and whether the sequence is done.

        A stop token (or EOS) finishes the sequence without its own text; what was held back is
        released with it, as `flush` would.
        """
        if self.finished:
            raise RuntimeError("push after the sequence finished; start a new StopChecker")
        if token_id in self._stop_ids:
            text, matched = self._scan(self._decoder.flush(), final=True)
            self.finished = True
            return StopResult(text, True, "stop", matched)
        text, matched = self._scan(self._decoder.push(token_id), final=False)
        if matched is not None:
            self.finished = True
            return StopResult(text, True, "stop", matched)
        return StopResult(text)

    def flush(self) -> str:
        """End of sequence (max_tokens): the held-back text, incomplete bytes as U+FFFD; then ""."""
        if self.finished:
            return ""
        self.finished = True
        text, _ = self._scan(self._decoder.flush(), final=True)
        return text

    def _scan(self, chunk: str, final: bool) -> tuple[str, str | None]:
        """Emit pending + chunk up to a complete stop string or to the part that could start one."""
        text = self._pending + chunk
        self._pending = ""
        best: tuple[int, int, str] | None = None  # (start, length, stop string): earliest, then shortest
        for stop in self._stops:
            at = text.find(stop)
            if at >= 0 and (best is None or (at, len(stop)) < best[:2]):
                best = (at, len(stop), stop)
        if best is not None:
            return text[: best[0]], best[2]
        if not final:
            keep = self._partial_match(text)
            self._pending = text[len(text) - keep :]
            text = text[: len(text) - keep]
        return text, None

    def _partial_match(self, text: str) -> int:
        """The length of the longest suffix of `text` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
