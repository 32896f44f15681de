"""Split streamed model text into reasoning (``<think>...</think>``) and the answer.

Rules the API adapters rely on:

* Tags are never emitted. Text that could still be the start of a tag is held back until it is known
  not to be, so a tag split across deltas is handled; nothing else is delayed, except whitespace at the
  very start of the output (it may precede the opening tag).
* The opening tag counts only at the very start of the output (after optional whitespace), and a think
  block opens at most once: after the closing tag everything is answer, literal tags included, so an
  answer that talks about ``<think>`` stays intact. With ``starts_in_reasoning=True`` (the template opened
  the block in the prompt, as Qwen3 does with thinking on) a repeated opening tag at the start is dropped.
* Whitespace right after either tag is stripped, like vLLM's reasoning parsers do after ``</think>``:
  Qwen3 writes ``<think>\\n...\\n</think>\\n\\nanswer``, which becomes reasoning ``...\\n`` and answer
  ``answer`` (the reasoning's trailing whitespace is not held back, so it stays).
* Output that never opens a think block passes through as answer unchanged. A think block still open at
  `finish` (the model ran out of tokens while thinking) stays reasoning: it has already been streamed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

_WS = " \t\r\n"


@dataclass(frozen=True)
class ReasoningDelta:
    """A piece of the model's reasoning (the inside of the think block)."""

    text: str


@dataclass(frozen=True)
class AnswerDelta:
    """A piece of the answer (everything outside the think block)."""

    text: str


def tag_prefix_len(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """Splits one turn's streamed text into `ReasoningDelta`s and `AnswerDelta`s (see the module docstring).

    `in_reasoning` tells whether text fed now would count as reasoning; `reasoning_chars` counts the
    characters emitted as reasoning so far (the server counts tokens itself).
    """

    def __init__(
        self, start_tag: str = "<think>", end_tag: str = "</think>", starts_in_reasoning: bool = False
    ) -> None:
        if not start_tag or not end_tag:
            raise ValueError("the reasoning tags must not be empty")
        self.start_tag, self.end_tag = start_tag, end_tag
        self.starts_in_reasoning = starts_in_reasoning
        self.reasoning_chars = 0
        # "start": nothing but whitespace seen, the opening tag may still come.
        self._state: Literal["start", "reasoning", "answer"] = "start"
        self._strip = False  # drop whitespace until the next other character
        self._buf = ""

    @property
    def in_reasoning(self) -> bool:
        """Whether text fed now would be reasoning."""
        return self._state == "reasoning" or (self._state == "start" and self.starts_in_reasoning)

    @property
    def answering(self) -> bool:
        """Whether the think block is over (or was never opened): everything from here is answer."""
        return self._state == "answer"

    @property
    def holding(self) -> bool:
        """Whether text is held back (it may be the start of a tag)."""
        return bool(self._buf)

    def feed(self, text: str) -> list[ReasoningDelta | AnswerDelta]:
        """Add the next piece of model output; return what can be emitted now."""
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[ReasoningDelta | AnswerDelta]:
        """End of output: release whatever was held back."""
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[ReasoningDelta | AnswerDelta]:
        out: list[ReasoningDelta | AnswerDelta] = []
        while self._buf:
            if self._strip:
                self._buf = self._buf.lstrip(_WS)
                if not self._buf:
                    break
                self._strip = False
            if self._state == "start":
                rest = self._buf.lstrip(_WS)
                if rest.startswith(self.start_tag):
                    self._buf, self._state, self._strip = rest[len(self.start_tag) :], "reasoning", True
                    continue
                if not final and self.start_tag.startswith(rest):
                    break  # only whitespace or a piece of the tag so far
                self._state = "reasoning" if self.starts_in_reasoning else "answer"
                # A prompt-opened block strips its leading whitespace too; an answer keeps it unchanged.
                self._strip = self.starts_in_reasoning
                continue
            if self._state == "answer":
                out.append(AnswerDelta(self._buf))
                self._buf = ""
                break
            end = self._buf.find(self.end_tag)
            if end >= 0:
                self._emit_reasoning(out, self._buf[:end])
                self._buf, self._state, self._strip = self._buf[end + len(self.end_tag) :], "answer", True
                continue
            keep = 0 if final else tag_prefix_len(self._buf, self.end_tag)
            self._emit_reasoning(out, self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            break
        return out

    def _emit_reasoning(self, out: list[ReasoningDelta | AnswerDelta], text: str) -> None:
        if text:
            self.reasoning_chars += len(text)
            out.append(ReasoningDelta(text))
