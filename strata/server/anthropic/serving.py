"""The Anthropic routes: Messages requests to `ChatRequest`s, engine events to content blocks and SSE events.

One pipeline serves both modes: a reply's token events become Anthropic stream events (`_Blocks`), which
streaming writes as SSE and non-streaming folds into `content` (`_content`), so both say the same. Also:

* `max_tokens` is clamped to the room left in the context, as Anthropic lets it exceed the window; a
  reply that fills the window then ends with "model_context_window_exceeded".
* Usage follows Anthropic's split: `input_tokens` are the prompt tokens not served from the prefix
  cache, `cache_read_input_tokens` those that were. The split is known only when the reply ends, so a
  stream's `message_start` counts the whole prompt as input and `message_delta` corrects it (the SDK's
  accumulator overwrites usage from `message_delta`); the sum is right in both.
* Which stop sequence matched: the engine's events do not say, so at the end the generated ids are
  decoded once and the text after the emitted text is compared with the stop sequences (the engine
  cuts the text just before the match, and picks the earliest, then shortest, one).
* A tool call the parser abandons after streaming part of it is closed as a block in the stream and
  dropped from a non-streamed reply; its raw text follows as text either way.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from strata.engine.llm_engine import TokenEvent
from strata.engine.sampler import SamplingParams
from strata.prompt.reasoning import ReasoningDelta, ReasoningSplitter
from strata.server import tool_parser as tp
from strata.server.anthropic import protocol as p
from strata.server.chat_service import ChatService, Prompt, check_finished
from strata.server.disconnect import cancel_on_disconnect
from strata.server.errors import bad_request
from strata.server.images import warning_headers
from strata.server.lenient_tools import LenientToolCallParser

Event = tuple[str, dict[str, Any]]  # an SSE event: its name and its data

# The one table of stop reasons, keyed by why the reply ended (see `_Reply.stop`).
_STOP_REASON = {
    "stop": "end_turn",  # end of turn (EOS)
    "abort": "end_turn",
    "stop_sequence": "stop_sequence",
    "tool_use": "tool_use",
    "length": "max_tokens",
    "context": "model_context_window_exceeded",
}


def _tool_use_id() -> str:
    return "toolu_" + tp.new_call_id().removeprefix("call_")


def _sse(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class _Blocks:
    """A reply's text to content-block events, in order: thinking, then text and tool_use blocks.

    Bare call objects (no `<tool_call>` tags) are calls too: see `strata.server.lenient_tools`.
    """

    def __init__(self, tools: bool, starts_in_reasoning: bool) -> None:
        self.splitter = ReasoningSplitter(starts_in_reasoning=starts_in_reasoning)
        self.parser = LenientToolCallParser(tools_enabled=tools, id_factory=_tool_use_id)
        self.index, self.kind = -1, ""  # the last block's index; the open block's type ("": none open)
        self.abandoned: set[int] = set()
        self.tool_uses = 0
        self._space = ""  # whitespace not yet in a block: a block of only whitespace is never opened
        self._out: list[Event] = []

    def feed(self, text: str) -> list[Event]:
        for piece in self.splitter.feed(text):
            self._piece(piece)
        return self._take()

    def finish(self) -> list[Event]:
        for piece in self.splitter.finish():
            self._piece(piece)
        for delta in self.parser.finish():
            self._delta(delta)
        self._close()
        return self._take()

    def _take(self) -> list[Event]:
        out, self._out = self._out, []
        return out

    def _piece(self, piece: Any) -> None:
        if isinstance(piece, ReasoningDelta):
            self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            self._emit({"type": "thinking_delta", "thinking": piece.text})
        else:
            self._answer(piece.text)

    def _answer(self, text: str) -> None:
        for delta in self.parser.feed(text):
            self._delta(delta)

    def _delta(self, delta: tp.Delta) -> None:
        if isinstance(delta, tp.TextDelta):
            self._text(delta.text)
        elif isinstance(delta, tp.ToolCallStart):
            self._close()
            self._space = ""
            self._open("tool_use", {"type": "tool_use", "id": delta.id, "name": delta.name, "input": {}})
        elif isinstance(delta, tp.ToolArgumentsDelta):
            self._emit({"type": "input_json_delta", "partial_json": delta.json_fragment})
        elif isinstance(delta, tp.ToolCallEnd):
            self._close()
            self.tool_uses += 1
        elif isinstance(delta, tp.ToolCallParseError) and delta.started:  # partly streamed: no tool use
            self.abandoned.add(self.index)
            self._close()

    def _text(self, text: str) -> None:
        if self.kind != "text":
            text, self._space = self._space + text, ""
            if not text.strip():
                self._space = text
                return
            self._open("text", {"type": "text", "text": ""})
        self._emit({"type": "text_delta", "text": text})

    def _open(self, kind: str, block: dict[str, Any]) -> None:
        if self.kind == kind:
            return
        self._close()
        self.index, self.kind = self.index + 1, kind
        data = {"type": "content_block_start", "index": self.index, "content_block": block}
        self._out.append(("content_block_start", data))

    def _emit(self, delta: dict[str, Any]) -> None:
        data = {"type": "content_block_delta", "index": self.index, "delta": delta}
        self._out.append(("content_block_delta", data))

    def _close(self) -> None:
        if self.kind:
            self._out.append(("content_block_stop", {"type": "content_block_stop", "index": self.index}))
            self.kind = ""


def _content(events: list[Event], abandoned: set[int]) -> list[dict[str, Any]]:
    """The `content` of a non-streamed reply: its stream events folded into blocks."""
    blocks: dict[int, dict[str, Any]] = {}
    args: dict[int, list[str]] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif name == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                args.setdefault(data["index"], []).append(delta["partial_json"])
    for i, block in blocks.items():
        if block["type"] == "tool_use" and i not in abandoned:
            block["input"] = json.loads("".join(args.get(i, ())) or "{}")
    return [block for i, block in sorted(blocks.items()) if i not in abandoned]


class _Reply:
    """One reply in progress: token events in, content-block events out; then stop reason and usage."""

    def __init__(
        self, service: ChatService, prompt: Prompt, sampling: SamplingParams, tools: bool, clamped: bool
    ) -> None:
        self.service, self.prompt, self.stops, self.clamped = service, prompt, sampling.stop, clamped
        self.blocks = _Blocks(tools, starts_in_reasoning=prompt.opened)
        self.ids: list[int] = []
        self.text: list[str] = []
        self.last: TokenEvent | None = None

    def push(self, event: TokenEvent) -> list[Event]:
        if event.token_id is not None:
            self.ids.append(event.token_id)
        self.text.append(event.text)
        self.last = event
        out = self.blocks.feed(event.text) if event.text else []
        return out + self.blocks.finish() if event.finished else out

    def stop_sequence(self) -> tuple[bool, str | None]:
        """Whether a stop sequence ended the reply, and which (None if it cannot be told)."""
        last = self.last
        eos = self.service.tokenizer.eos_ids
        if last is None or last.finish_reason != "stop" or not self.stops or last.token_id in eos:
            return False, None
        emitted, decoded = "".join(self.text), self.service.tokenizer.decode(self.ids)
        tail = decoded[len(emitted) :] if decoded.startswith(emitted) else ""
        hits = [s for s in self.stops if tail.startswith(s)]
        return True, min(hits, key=len) if hits else None

    def stop(self) -> dict[str, Any]:
        """`stop_reason` and `stop_sequence`, mapped through `_STOP_REASON`."""
        reason = (self.last.finish_reason if self.last else None) or "stop"
        hit, sequence = self.stop_sequence()
        if reason == "length":
            cause = "context" if self.clamped and len(self.ids) >= self.prompt.max_tokens else "length"
        elif self.blocks.tool_uses:
            cause = "tool_use"
        else:
            cause = "stop_sequence" if hit else reason
        return {"stop_reason": _STOP_REASON[cause], "stop_sequence": sequence if hit else None}

    def usage(self, final: bool = True) -> dict[str, int]:
        cached = (self.last.cached_tokens or 0) if final and self.last else 0
        return {
            "input_tokens": len(self.prompt.ids) - cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": len(self.ids),
        }


class AnthropicServing:
    def __init__(self, service: ChatService, model_name: str) -> None:
        self.service, self.model_name = service, model_name

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/v1/messages", self.messages, methods=["POST"], response_model=None)
        router.add_api_route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"])
        return router

    async def count_tokens(self, req: p.CountTokensRequest) -> dict[str, int]:
        if req.tool_choice is not None and req.tool_choice.type in ("any", "tool"):
            # Only generating with a forced call needs constrained decoding; counting renders it as auto.
            req = req.model_copy(update={"tool_choice": None})
        chat = p.to_chat(req, SamplingParams(max_tokens=None), p.thinking_request(req), "drop")
        return {"input_tokens": len(self.service.chat_prompt(chat).ids)}

    @cancel_on_disconnect
    async def messages(
        self, req: p.MessagesRequest, raw_request: Request
    ) -> JSONResponse | StreamingResponse:
        thinking = p.thinking_request(req)
        if thinking.budget_tokens is not None and thinking.budget_tokens >= req.max_tokens:
            raise bad_request(
                f"thinking.budget_tokens ({thinking.budget_tokens}) must be less than max_tokens "
                f"({req.max_tokens}); lower the budget or raise max_tokens",
                "thinking.budget_tokens",
            )
        sampling = p.sampling_params(req, req.max_tokens, self.service.sampling_defaults(thinking))
        chat = p.to_chat(req, sampling, thinking, self.service.model_config.images)
        # Anthropic lets max_tokens exceed the room left in the context: clamp it rather than refuse.
        prompt = self.service.chat_prompt(chat, clamp=True)
        limit = prompt.max_tokens
        sampling = replace(sampling, max_tokens=limit)
        reply = _Reply(self.service, prompt, sampling, chat.tools is not None, clamped=limit < req.max_tokens)
        events = cast(AsyncGenerator[TokenEvent, None], self.service.events(prompt, sampling))
        first = await anext(events)  # errors before the first token become HTTP errors, not broken streams
        head: dict[str, Any] = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant"}
        head |= {"model": self.model_name, "content": [], "stop_reason": None, "stop_sequence": None}
        headers = warning_headers(list(prompt.warnings))
        if req.stream:
            stream = self._stream(head, reply, first, events)
            headers |= {"Cache-Control": "no-cache"}
            return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
        collected: list[Event] = []
        try:
            event: TokenEvent | None = first
            while event is not None:
                collected += reply.push(event)
                event = None if event.finished else await anext(events, None)
        finally:
            await events.aclose()  # a client gone mid-reply aborts the request
        assert reply.last is not None
        check_finished(reply.last)
        body = head | {"content": _content(collected, reply.blocks.abandoned)} | reply.stop()
        body |= {"usage": reply.usage()} | ({"warnings": list(prompt.warnings)} if prompt.warnings else {})
        return JSONResponse(body, headers=headers)

    async def _stream(
        self, head: dict[str, Any], reply: _Reply, first: TokenEvent, events: AsyncGenerator[TokenEvent, None]
    ) -> AsyncIterator[str]:
        try:
            yield _sse(
                "message_start", {"type": "message_start", "message": head | {"usage": reply.usage(False)}}
            )
            event: TokenEvent | None = first
            while event is not None:
                if event.finish_reason == "error":
                    error = {"type": "api_error", "message": event.error or "generation failed"}
                    yield _sse("error", {"type": "error", "error": error})
                    return
                for name, data in reply.push(event):
                    yield _sse(name, data)
                event = None if event.finished else await anext(events, None)
            yield _sse(
                "message_delta", {"type": "message_delta", "delta": reply.stop(), "usage": reply.usage()}
            )
            yield _sse("message_stop", {"type": "message_stop"})
        finally:
            await events.aclose()  # closing the engine's stream aborts the request (client disconnects)
