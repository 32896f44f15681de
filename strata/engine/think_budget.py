"""Reasoning budgets: end a think block after N tokens by writing its end into the same sequence.

When a turn has spent its reasoning budget, the engine appends `wrap_up_ids` (a short wrap-up sentence
and the end-of-think tag, tokenized by the server) to the running sequence, as if the model had written
them; the next step computes their KV in one chunk and sampling continues into the answer. Nothing is
restarted and no prompt is re-sent, so the answer sees the whole reasoning.

The budget never cuts inside a tool call (a `<tool_call>` opened in the reasoning and not yet closed),
nor while the text so far may be the start of a tag; it waits for the next token.
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.prompt.reasoning import ReasoningDelta, ReasoningSplitter, tag_prefix_len


@dataclass(frozen=True)
class ThinkBudget:
    """At most `max_tokens` generated tokens of reasoning in this turn, then `wrap_up_ids`."""

    max_tokens: int
    wrap_up_ids: tuple[int, ...]
    starts_in_reasoning: bool = False  # the prompt already opened the think block
    start_tag: str = "<think>"
    end_tag: str = "</think>"
    tool_open: str = "<tool_call>"
    tool_close: str = "</tool_call>"

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"reasoning budget {self.max_tokens} must be 0 or more tokens")
        if not self.wrap_up_ids:
            raise ValueError("a reasoning budget needs the tokens that end the think block")


class ThinkTracker:
    """Follows one turn's text; `due()` says when to append the budget's wrap-up tokens."""

    def __init__(self, budget: ThinkBudget) -> None:
        self.budget = budget
        self.splitter = ReasoningSplitter(budget.start_tag, budget.end_tag, budget.starts_in_reasoning)
        self.reasoning_tokens = 0
        self.wrapped = False  # the wrap-up was appended; nothing more to do
        self._open_calls = 0  # tool calls opened inside the reasoning and not yet closed
        self._tail = ""  # the end of the reasoning text, enough to see a tag split across tokens

    def push(self, text: str) -> None:
        """One generated token and the text it completed (possibly empty)."""
        if self.wrapped or self.splitter.answering:
            return
        if self.splitter.in_reasoning:
            self.reasoning_tokens += 1
        for piece in self.splitter.feed(text):
            if isinstance(piece, ReasoningDelta):
                self._follow_tool_calls(piece.text)

    def _follow_tool_calls(self, text: str) -> None:
        b = self.budget
        keep = max(len(b.tool_open), len(b.tool_close)) - 1
        scan = self._tail + text
        self._open_calls += _count_new(scan, b.tool_open, len(self._tail))
        self._open_calls -= _count_new(scan, b.tool_close, len(self._tail))
        self._open_calls = max(self._open_calls, 0)
        self._tail = scan[-keep:] if keep else ""

    def due(self) -> bool:
        """Whether the wrap-up should be appended now."""
        return (
            not self.wrapped
            and self.splitter.in_reasoning
            and self.reasoning_tokens >= self.budget.max_tokens
            and self._open_calls == 0
            and not self.splitter.holding
            and not tag_prefix_len(self._tail, self.budget.tool_open)  # a call may be starting
        )


def _count_new(text: str, tag: str, seen: int) -> int:
    """Occurrences of `tag` in `text` that end after position `seen` (not counted before)."""
    count, start = 0, text.find(tag)
    while start >= 0:
        if start + len(tag) > seen:
            count += 1
        start = text.find(tag, start + len(tag))
    return count
