"""Whether a request thinks, and how many tokens its reasoning may take.

A template thinks when its source writes the reasoning start tag (`<think>`). A request turns thinking
on or off through its API (Anthropic `thinking`, OpenAI `reasoning_effort` or
`chat_template_kwargs.enable_thinking`); templates that take `enable_thinking` get it passed through.

The budget, for a thinking request with `max_new` completion tokens:

* explicit: Anthropic `thinking.budget_tokens` or the `reasoning_budget_tokens` extension;
* `reasoning_effort` as a fraction of `max_new` (`EFFORT_FRACTIONS`);
* otherwise, with answer room on (the per-model config) and `max_new >= 1024`:
  `max_new - max(512, max_new / 4)`, so the answer keeps at least a quarter (and 512 tokens);
* otherwise none: the reasoning may run to `max_new`.

When a budget is spent the engine appends the wrap-up sentence and the end tag to the same sequence
(`strata.engine.think_budget`). Each kind of decision is logged once per server, not per request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from strata.engine.think_budget import ThinkBudget
from strata.prompt.chat_template import ChatTemplate
from strata.prompt.tokenizer import Tokenizer
from strata.server.errors import bad_request
from strata.server.model_config import ModelServingConfig

logger = logging.getLogger(__name__)

EFFORT_FRACTIONS = {"minimal": 0.1, "low": 0.25, "medium": 0.5, "high": 0.8}
ANSWER_ROOM_MIN_NEW = 1024  # below this, answer room sets no budget


@dataclass(frozen=True)
class ThinkingRequest:
    """What a request said about thinking; None fields: it did not say."""

    enabled: bool | None = None
    budget_tokens: int | None = None
    effort: str | None = None

    def __post_init__(self) -> None:
        if self.budget_tokens is not None and self.budget_tokens < 0:
            raise bad_request(
                f"the reasoning budget is {self.budget_tokens} tokens; it must be 0 or more", "budget_tokens"
            )
        if self.effort is not None and self.effort not in EFFORT_FRACTIONS and self.effort != "none":
            allowed = ", ".join(["none", *EFFORT_FRACTIONS])
            raise bad_request(f"reasoning_effort {self.effort!r} is not one of {allowed}", "reasoning_effort")

    @property
    def wanted(self) -> bool | None:
        """True/False when the request turned thinking on/off, None when it left the template's default."""
        if self.enabled is not None:
            return self.enabled
        if self.effort is not None:
            return self.effort != "none"
        return True if self.budget_tokens is not None else None


class ThinkingPolicy:
    def __init__(
        self, template: ChatTemplate | None, tokenizer: Tokenizer, config: ModelServingConfig
    ) -> None:
        self.tokenizer, self.format, self.answer_room = tokenizer, config.reasoning, config.answer_room
        source = template.source if template is not None else ""
        self.template_thinks = self.format.start in source
        self.takes_switch = "enable_thinking" in source
        # The blank line after the end tag is how thinking models (Qwen3) start their answer.
        wrap = self.format.wrap_up + self.format.end + "\n\n"
        self.wrap_up_ids = tuple(tokenizer.encode(wrap, parse_special=True))  # server text: tags are tags
        self._logged: set[str] = set()

    def template_kwargs(self, request: ThinkingRequest) -> dict[str, bool]:
        """`enable_thinking` for templates that take it, when the request said."""
        wanted = request.wanted
        return {"enable_thinking": wanted} if self.takes_switch and wanted is not None else {}

    def thinks(self, request: ThinkingRequest) -> bool:
        """Whether this request's reply may reason (chooses the thinking sampling defaults)."""
        return self.template_thinks and request.wanted is not False

    def opened(self, prompt_ids: list[int]) -> bool:
        """Whether the rendered prompt ends inside an open think block (the template opened it)."""
        return self.tokenizer.decode(prompt_ids[-8:]).rstrip().endswith(self.format.start)

    def budget(self, request: ThinkingRequest, opened: bool, max_new: int) -> ThinkBudget | None:
        """The budget for a request whose prompt `opened` (or not) the think block."""
        if not self.template_thinks or request.wanted is False:
            return None
        if request.budget_tokens is not None:
            tokens, why = request.budget_tokens, "explicit budget from the request"
        elif request.effort in EFFORT_FRACTIONS:
            fraction = EFFORT_FRACTIONS[request.effort]
            tokens, why = (
                int(max_new * fraction),
                f"reasoning_effort {request.effort}: {fraction:g} of max_tokens",
            )
        elif self.answer_room and max_new >= ANSWER_ROOM_MIN_NEW:
            tokens = max_new - max(512, max_new // 4)
            why = "answer room: max_tokens - max(512, max_tokens / 4) when max_tokens >= 1024"
        else:
            self._log_once("none", "no reasoning budget (answer room off, or max_tokens < 1024)")
            return None
        self._log_once(why, f"reasoning budget: {why}")
        if tokens >= max_new:
            return None  # the completion limit ends the reasoning first
        return ThinkBudget(tokens, self.wrap_up_ids, opened, self.format.start, self.format.end)

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            logger.info(message)
