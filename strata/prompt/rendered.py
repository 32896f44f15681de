"""`RenderedPrompt`: a rendered chat template that knows which characters came from outside it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RenderedPrompt:
    """The template's output text, and the character ranges of it that are plain (untrusted) text.

    `plain` holds sorted, non-overlapping, non-empty [start, end) ranges into `text`: every character
    that came from message content, tool results, tool-call arguments, replayed reasoning, tool
    schemas or system text. Only the rest (the template's own scaffolding) may produce special tokens.
    """

    text: str
    plain: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        end = 0
        for start, stop in self.plain:
            if not (end <= start < stop <= len(self.text)):
                raise ValueError(
                    f"plain spans must be sorted, disjoint, non-empty ranges of the text: {self.plain}"
                )
            end = stop

    @classmethod
    def trusted(cls, text: str) -> RenderedPrompt:
        """All scaffolding: special tokens anywhere are honoured (an operator's explicit opt-out)."""
        return cls(text, ())

    @classmethod
    def untrusted(cls, text: str) -> RenderedPrompt:
        """All plain: raw user text that must never produce a special token."""
        return cls(text, ((0, len(text)),) if text else ())
