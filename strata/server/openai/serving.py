"""The OpenAI routes: wire requests to `ChatRequest`s, engine events to completions and SSE chunks."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from strata.engine.llm_engine import TokenEvent
from strata.engine.sampler import SamplingParams
from strata.server.chat_service import ChatRequest, ChatService, Prompt, check_finished
from strata.server.disconnect import cancel_on_disconnect
from strata.server.errors import bad_request
from strata.server.images import warning_headers
from strata.server.openai import protocol as p
from strata.server.openai.params import chat_sampling_params, sampling_params
from strata.server.openai.tool_calls import ChatOutput, template_messages
from strata.server.thinking import ThinkingRequest

_FINISH = {"stop": "stop", "length": "length", "abort": "stop", "error": "stop"}


def _sse(payload: BaseModel | str) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json(exclude_none=True)
    return f"data: {data}\n\n"


class OpenAIServing:
    def __init__(self, service: ChatService, model_name: str) -> None:
        self.service, self.model_name = service, model_name
        self.created = int(time.time())

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/v1/chat/completions", self.chat, methods=["POST"], response_model=None)
        router.add_api_route("/v1/completions", self.completions, methods=["POST"], response_model=None)
        router.add_api_route("/v1/models", self.models, methods=["GET"])
        router.add_api_route("/tokenize", self.tokenize, methods=["POST"])
        router.add_api_route("/detokenize", self.detokenize, methods=["POST"])
        return router

    async def models(self) -> p.ModelList:
        return p.ModelList(data=[p.ModelCard(id=self.model_name, created=self.created)])

    @cancel_on_disconnect
    async def chat(
        self, req: p.ChatCompletionRequest, raw_request: Request
    ) -> JSONResponse | StreamingResponse:
        kwargs = dict(req.chat_template_kwargs or {})
        switch = kwargs.get("enable_thinking")
        thinking = ThinkingRequest(
            enabled=switch if isinstance(switch, bool) else None,
            budget_tokens=req.reasoning_budget_tokens,
            effort=req.reasoning_effort,
        )
        defaults = self.service.sampling_defaults(thinking)
        sampling = chat_sampling_params(req, self.service.tokenizer.vocab_size, defaults)
        tools = req.tools if req.tool_choice != "none" else None
        messages = template_messages(req.messages)
        chat = ChatRequest(messages, sampling, tools, kwargs, thinking)
        prompt = self.service.chat_prompt(chat)
        events = self.service.events(prompt, sampling)
        first = await anext(events)  # errors before the first token become HTTP errors, not broken streams
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        output = ChatOutput(tools_enabled=bool(tools), reasoning=prompt.reasoning, opened=prompt.opened)
        if req.stream:
            chunks = self._chat_chunks(first, events, output, prompt, rid, created, include_usage)
            return self._stream(chunks, list(prompt.warnings))
        logprobs, last, num_tokens = [], first, 0
        async for event in _chain(first, events):
            output.feed(event.text)
            logprobs += self._logprobs(event, sampling)
            num_tokens += event.token_id is not None
            last = event
        check_finished(last)
        output.finish()
        choice = p.ChatChoice(
            message=output.message(),
            finish_reason=output.finish_reason(last.finish_reason),
            logprobs=p.ChoiceLogprobs(content=logprobs) if sampling.logprobs else None,
        )
        usage = _usage(prompt, num_tokens, last)
        warnings = list(prompt.warnings) or None
        body = p.ChatCompletion(
            id=rid, created=created, model=self.model_name, choices=[choice], usage=usage, warnings=warnings
        )
        headers = warning_headers(list(prompt.warnings))
        exclude = None if warnings else {"warnings"}
        return JSONResponse(body.model_dump(mode="json", exclude=exclude), headers=headers)

    async def _chat_chunks(
        self,
        first: TokenEvent,
        events: AsyncIterator[TokenEvent],
        output: ChatOutput,
        prompt: Prompt,
        rid: str,
        created: int,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        def chunk(delta: p.ChatDelta, finish: str | None = None) -> str:
            choice = p.ChatChunkChoice(delta=delta, finish_reason=finish)
            return _sse(
                p.ChatCompletionChunk(id=rid, created=created, model=self.model_name, choices=[choice])
            )

        yield chunk(p.ChatDelta(role="assistant", content=""))
        completion_tokens = 0
        async for event in _closing(_chain(first, events), events):
            completion_tokens += event.token_id is not None
            for delta in output.feed(event.text):
                yield chunk(delta)
            if event.finished:
                if event.finish_reason == "error":
                    yield _sse(json.dumps({"error": {"message": event.error, "type": "server_error"}}))
                    break
                for delta in output.finish():
                    yield chunk(delta)
                yield chunk(p.ChatDelta(), output.finish_reason(event.finish_reason))
                if include_usage:
                    usage = _usage(prompt, completion_tokens, event)
                    yield _sse(
                        p.ChatCompletionChunk(
                            id=rid, created=created, model=self.model_name, choices=[], usage=usage
                        )
                    )
        yield _sse("[DONE]")

    @cancel_on_disconnect
    async def completions(
        self, req: p.CompletionRequest, raw_request: Request
    ) -> p.Completion | StreamingResponse:
        if not isinstance(req.prompt, str):
            if len(req.prompt) != 1:
                raise bad_request("prompt must be one string; batches of prompts are not supported", "prompt")
            req.prompt = req.prompt[0]
        max_tokens = req.max_tokens if "max_tokens" in req.model_fields_set else 16  # OpenAI's default
        defaults = self.service.model_config.sampling
        sampling = sampling_params(req, self.service.tokenizer.vocab_size, max_tokens, defaults)
        prompt = self.service.text_prompt(req.prompt, sampling)
        events = self.service.events(prompt, sampling)
        first = await anext(events)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        echo = req.prompt if req.echo else ""
        if req.stream:
            return self._stream(self._completion_chunks(first, events, rid, created, echo))
        text, last, num_tokens = [echo], first, 0
        async for event in _chain(first, events):
            text.append(event.text)
            num_tokens += event.token_id is not None
            last = event
        check_finished(last)
        choice = p.CompletionChoice(text="".join(text), finish_reason=_FINISH[last.finish_reason or "stop"])
        usage = _usage(prompt, num_tokens, last)
        return p.Completion(id=rid, created=created, model=self.model_name, choices=[choice], usage=usage)

    async def _completion_chunks(
        self, first: TokenEvent, events: AsyncIterator[TokenEvent], rid: str, created: int, echo: str
    ) -> AsyncIterator[str]:
        def chunk(text: str, finish: str | None = None) -> str:
            choice = p.CompletionChoice(text=text, finish_reason=finish)
            return _sse(p.Completion(id=rid, created=created, model=self.model_name, choices=[choice]))

        if echo:
            yield chunk(echo)
        async for event in _closing(_chain(first, events), events):
            if event.text:
                yield chunk(event.text)
            if event.finished:
                yield chunk("", _FINISH[event.finish_reason or "stop"])
        yield _sse("[DONE]")

    def _stream(self, chunks: AsyncIterator[str], warnings: list[str] | None = None) -> StreamingResponse:
        headers = {"Cache-Control": "no-cache"} | warning_headers(warnings or [])
        return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)

    def _logprobs(self, event: TokenEvent, sampling: SamplingParams) -> list[p.TokenLogprob]:
        if not sampling.logprobs or event.token_id is None or event.logprob is None:
            return []
        piece = self._piece
        tops = [p.TopLogprob(token=piece(i), logprob=lp) for i, lp in event.top_logprobs or []]
        return [p.TokenLogprob(token=piece(event.token_id), logprob=event.logprob, top_logprobs=tops)]

    def _piece(self, token_id: int) -> str:
        return self.service.tokenizer.decode([token_id])

    async def tokenize(self, req: p.TokenizeRequest) -> dict[str, Any]:
        tokenizer = self.service.tokenizer
        if req.messages is not None:
            prompt = self.service.chat_prompt(ChatRequest(req.messages, SamplingParams(max_tokens=None)))
            ids = prompt.ids
        else:
            ids = tokenizer.encode(req.prompt or "", add_special=req.add_special_tokens, parse_special=False)
        return {"tokens": ids, "count": len(ids), "max_model_len": self.service.context_length}

    async def detokenize(self, req: p.DetokenizeRequest) -> dict[str, Any]:
        vocab = self.service.tokenizer.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise bad_request(f"token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})", "tokens")
        return {"prompt": self.service.tokenizer.decode(req.tokens)}


async def _closing(
    inner: AsyncIterator[TokenEvent], events: AsyncIterator[TokenEvent]
) -> AsyncIterator[TokenEvent]:
    """Iterate `inner`; however the stream ends (a client disconnect included), close the engine
    stream at once so the request is aborted and its KV blocks freed."""
    try:
        async for event in inner:
            yield event
    finally:
        await cast(AsyncGenerator[TokenEvent, None], events).aclose()


async def _chain(first: TokenEvent, rest: AsyncIterator[TokenEvent]) -> AsyncIterator[TokenEvent]:
    yield first
    if not first.finished:
        async for event in rest:
            yield event
            if event.finished:
                return


def _usage(prompt: Prompt, completion_tokens: int, last: TokenEvent) -> p.Usage:
    cached = last.cached_tokens or 0
    return p.Usage(
        prompt_tokens=len(prompt.ids),
        completion_tokens=completion_tokens,
        total_tokens=len(prompt.ids) + completion_tokens,
        prompt_tokens_details=p.PromptTokensDetails(cached_tokens=cached),
    )
