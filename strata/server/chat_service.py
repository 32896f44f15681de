"""The one path every API family takes: an internal `ChatRequest` to prompt ids to engine events.

The OpenAI and Anthropic adapters convert their wire requests into a `ChatRequest`; this module
renders the chat template special-safely, encodes incrementally (agent clients resend the whole
conversation every turn), checks the context limit, and streams the engine's token events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

from strata.engine.async_engine import AsyncEngine
from strata.engine.llm_engine import TokenEvent
from strata.engine.sampler import SamplingParams, max_new_tokens
from strata.engine.scheduler import EngineBusy
from strata.prompt.chat_template import ChatTemplate, TemplateError
from strata.prompt.encoder import PromptEncoder
from strata.prompt.rendered import RenderedPrompt
from strata.prompt.tokenizer import Tokenizer
from strata.server.config import ServerConfig
from strata.server.errors import APIError, bad_request, busy


@dataclass(frozen=True)
class ChatRequest:
    """A chat as every API family hands it over: OpenAI-shaped messages and strata's own params."""

    messages: list[dict[str, Any]]
    sampling: SamplingParams
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    max_tokens: int  # the completion limit after fitting into the context


class ChatService:
    def __init__(
        self,
        engine: AsyncEngine,
        tokenizer: Tokenizer,
        template: ChatTemplate | None,
        context_length: int,
        config: ServerConfig,
    ) -> None:
        self.engine, self.tokenizer, self.template = engine, tokenizer, template
        self.context_length, self.config = context_length, config
        self.encoder = PromptEncoder(tokenizer, keep=min(config.conversation_slots, 16))

    def chat_prompt(self, chat: ChatRequest) -> Prompt:
        if self.template is None:
            raise bad_request(
                "the model has no chat template; start the server with --chat-template chatml, "
                "or use /v1/completions with raw text"
            )
        try:
            rendered = self.template.render_prompt(
                chat.messages, tools=chat.tools, protect=not self.config.trust_prompts, **chat.template_kwargs
            )
        except TemplateError as e:
            raise bad_request(str(e), "messages") from None
        return self._fit(list(self.encoder.encode(rendered).ids), chat.sampling)

    def text_prompt(self, text: str, sampling: SamplingParams) -> Prompt:
        """Raw completion text: plain like any client text, unless the operator trusts prompts."""
        prompt = RenderedPrompt.trusted(text) if self.config.trust_prompts else RenderedPrompt.untrusted(text)
        ids = list(self.encoder.encode(prompt, store=False).ids)
        if self.tokenizer.add_bos and self.tokenizer.bos_id is not None:
            ids.insert(0, self.tokenizer.bos_id)
        return self._fit(ids, sampling)

    def _fit(self, ids: list[int], sampling: SamplingParams) -> Prompt:
        if not ids:
            raise bad_request("the prompt is empty; send at least one token of text")
        try:
            limit = max_new_tokens(sampling, len(ids), self.context_length)
        except ValueError as e:
            raise bad_request(str(e), "max_tokens") from None
        return Prompt(ids, limit)

    async def events(self, prompt: Prompt, sampling: SamplingParams) -> AsyncIterator[TokenEvent]:
        """The engine's events for one prompt; closing the iterator early aborts the request."""
        stream = cast(AsyncGenerator[TokenEvent, None], self.engine.generate(prompt.ids, sampling))
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
