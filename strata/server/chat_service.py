"""The one path every API family takes: an internal `ChatRequest` to prompt ids to engine events.

The OpenAI and Anthropic adapters convert their wire requests into a `ChatRequest`; this module
renders the chat template special-safely, encodes incrementally (agent clients resend the whole
conversation every turn), checks the context limit, and streams the engine's token events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any, cast

from strata.engine.async_engine import AsyncEngine
from strata.engine.llm_engine import TokenEvent
from strata.engine.sampler import SamplingParams, max_new_tokens
from strata.engine.scheduler import EngineBusy
from strata.engine.think_budget import ThinkBudget
from strata.prompt.chat_template import ChatTemplate, TemplateError
from strata.prompt.encoder import PromptEncoder
from strata.prompt.rendered import RenderedPrompt
from strata.prompt.tokenizer import Tokenizer
from strata.server.config import ServerConfig
from strata.server.errors import APIError, bad_request, busy
from strata.server.images import strip_images
from strata.server.model_config import ModelServingConfig, SamplingDefaults
from strata.server.thinking import ThinkingPolicy, ThinkingRequest


@dataclass(frozen=True)
class ChatRequest:
    """A chat as every API family hands it over: OpenAI-shaped messages and strata's own params."""

    messages: list[dict[str, Any]]
    sampling: SamplingParams
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    thinking: ThinkingRequest = field(default_factory=ThinkingRequest)
    warnings: tuple[str, ...] = ()  # what the adapter dropped (images), for the response


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    max_tokens: int  # the completion limit after fitting into the context
    think: ThinkBudget | None = None  # the reasoning budget the engine enforces
    reasoning: bool = False  # the reply may open a think block: split it off as reasoning
    opened: bool = False  # the prompt itself opened the think block
    warnings: tuple[str, ...] = ()


class ChatService:
    def __init__(
        self,
        engine: AsyncEngine,
        tokenizer: Tokenizer,
        template: ChatTemplate | None,
        context_length: int,
        config: ServerConfig,
        model_config: ModelServingConfig | None = None,
    ) -> None:
        self.engine, self.tokenizer, self.template = engine, tokenizer, template
        self.model_config = model_config or ModelServingConfig()
        self.context_length = min(context_length, self.model_config.context_size or context_length)
        self.config = config
        self.encoder = PromptEncoder(tokenizer, keep=min(config.conversation_slots, 16))
        self.thinking = ThinkingPolicy(template, tokenizer, self.model_config)

    def sampling_defaults(self, thinking: ThinkingRequest) -> SamplingDefaults:
        """The per-model sampling defaults for a request (the thinking set when it thinks)."""
        return self.model_config.sampling_for(self.thinking.thinks(thinking))

    def chat_prompt(self, chat: ChatRequest, clamp: bool = False) -> Prompt:
        """The request's prompt ids and completion limit; `clamp`: a max_tokens past the room left in
        the context is cut to it (Anthropic's rule) instead of refused (OpenAI's)."""
        if self.template is None:
            raise bad_request(
                "the model has no chat template; start the server with --chat-template chatml, "
                "or use /v1/completions with raw text"
            )
        messages, dropped = strip_images(chat.messages, self.model_config.images)
        kwargs = self.thinking.template_kwargs(chat.thinking) | chat.template_kwargs  # the client's last
        try:
            rendered = self.template.render_prompt(
                messages, tools=chat.tools, protect=not self.config.trust_prompts, **kwargs
            )
        except TemplateError as e:
            raise bad_request(str(e), "messages") from None
        fitted = self._fit(list(self.encoder.encode(rendered).ids), chat.sampling, clamp)
        thinks = self.thinking.thinks(chat.thinking) and kwargs.get("enable_thinking") is not False
        opened = self.thinking.opened(fitted.ids)
        return replace(
            fitted,
            think=self.thinking.budget(chat.thinking, opened, fitted.max_tokens) if thinks else None,
            reasoning=self.thinking.template_thinks,
            opened=opened,
            warnings=chat.warnings + tuple(dropped),
        )

    def text_prompt(self, text: str, sampling: SamplingParams) -> Prompt:
        """Raw completion text: plain like any client text, unless the operator trusts prompts."""
        prompt = RenderedPrompt.trusted(text) if self.config.trust_prompts else RenderedPrompt.untrusted(text)
        ids = list(self.encoder.encode(prompt, store=False).ids)
        if self.tokenizer.add_bos and self.tokenizer.bos_id is not None:
            ids.insert(0, self.tokenizer.bos_id)
        return self._fit(ids, sampling)

    def _fit(self, ids: list[int], sampling: SamplingParams, clamp: bool = False) -> Prompt:
        if not ids:
            raise bad_request("the prompt is empty; send at least one token of text")
        requested = sampling.max_tokens
        try:
            limit = max_new_tokens(
                replace(sampling, max_tokens=None) if clamp else sampling, len(ids), self.context_length
            )
        except ValueError as e:
            raise bad_request(str(e), "max_tokens") from None
        if clamp and requested is not None:
            limit = min(limit, requested)
        if sampling.max_tokens is None and not self.model_config.fit_max_tokens:
            limit = min(limit, self.model_config.default_max_tokens)
        return Prompt(ids, limit)

    async def events(self, prompt: Prompt, sampling: SamplingParams) -> AsyncIterator[TokenEvent]:
        """The engine's events for one prompt; closing the iterator early aborts the request."""
        sampling = replace(sampling, max_tokens=prompt.max_tokens)  # the fitted limit, config applied
        generate = self.engine.generate(prompt.ids, sampling, think=prompt.think)
        stream = cast(AsyncGenerator[TokenEvent, None], generate)
        try:
            first = await anext(stream)
        except EngineBusy as e:
            raise busy(str(e)) from None
        except ValueError as e:
            raise bad_request(str(e)) from None
        try:
            yield first
            async for event in stream:
                yield event
        finally:
            await stream.aclose()


def check_finished(event: TokenEvent) -> None:
    """A request the engine failed becomes a 500 with its message (never a hang)."""
    if event.finish_reason == "error":
        raise APIError(500, event.error or "generation failed", "server_error")
