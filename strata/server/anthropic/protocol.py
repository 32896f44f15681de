"""Anthropic Messages wire types, and their conversion to the internal, OpenAI-shaped `ChatRequest`.

The conversion (`chat_messages`, `chat_tools`, `to_chat`) is pure, so it is tested without a model:

* `system` (a string or text blocks) becomes one system message; text blocks are joined with "\\n", as
  `strata.prompt.messages` joins OpenAI text parts.
* A system message in `messages` (the 2.x client allows them) stays a system message, text only.
* A user turn's blocks become, in order, user messages (runs of text blocks) and one "tool" message per
  `tool_result` (its `tool_use_id` as `tool_call_id`, its text content joined).
* An assistant turn's text becomes its content, `tool_use` blocks its `tool_calls`, `thinking` blocks its
  `reasoning_content`. Arguments stay a JSON *object*, not OpenAI's JSON string: chat templates
  (Qwen2.5's among them) `tojson` the arguments, which would render a string double-encoded.
* Images and documents: the models strata serves have no vision, so, as the per-model config says
  (`images`), they are dropped and the reply says so (the default), or refused with a 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from strata.engine.sampler import SamplingParams
from strata.server.chat_service import ChatRequest
from strata.server.errors import bad_request
from strata.server.images import note_dropped, refused
from strata.server.model_config import SamplingDefaults
from strata.server.thinking import ThinkingRequest


class _Wire(BaseModel):
    # Clients send fields strata has no use for (cache_control, citations, metadata...): accept, ignore.
    model_config = ConfigDict(extra="allow")


class TextBlock(_Wire):
    type: Literal["text"]
    text: str


class ImageBlock(_Wire):
    type: Literal["image"]


class DocumentBlock(_Wire):
    type: Literal["document"]


class ToolUseBlock(_Wire):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Wire):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]] = ""
    is_error: bool = False


class ThinkingBlock(_Wire):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Wire):
    type: Literal["redacted_thinking"]


ContentBlock = Annotated[
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class Message(_Wire):
    role: Literal["user", "assistant", "system"]  # system: text only, as in the 2.x client's types
    content: str | list[ContentBlock]


class Tool(_Wire):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # None or "custom"; Anthropic's server tools (web_search_...) have others


class ToolChoice(_Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class Thinking(_Wire):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class CountTokensRequest(_Wire):
    """What `/v1/messages/count_tokens` takes: the conversation, without generation settings."""

    model: str
    messages: list[Message]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest):
    """A `/v1/messages` body. `max_tokens` is required, as Anthropic requires it."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None  # "effort" is ignored; "format" is refused


class _Images:
    """What to do with image and document blocks: drop them (counted) or refuse the request."""

    def __init__(self, policy: Literal["drop", "refuse"]) -> None:
        self.policy, self.dropped = policy, 0

    def skip(self, where: str, block: BaseModel) -> None:
        if self.policy == "refuse":
            raise refused(where, "an image" if isinstance(block, ImageBlock) else "a document")
        self.dropped += 1


def _joined_text(blocks: list[Any], where: str, images: _Images) -> str:
    texts = []
    for j, block in enumerate(blocks):
        if isinstance(block, ImageBlock | DocumentBlock):
            images.skip(f"{where}, block {j}", block)
            continue
        if not isinstance(block, TextBlock):
            raise bad_request(
                f"{where}, block {j}: only text blocks can go here, not {block.type}", "messages"
            )
        texts.append(block.text)
    return "\n".join(texts)


def _user(i: int, blocks: list[ContentBlock], images: _Images) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
            texts.clear()

    for j, block in enumerate(blocks):
        where = f"message {i}, content block {j}"
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolResultBlock):
            flush()
            content = block.content
            if isinstance(content, str):
                text = content
            else:
                text = _joined_text(content, f"{where} (tool_result)", images)
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": text})
        elif isinstance(block, ImageBlock | DocumentBlock):
            images.skip(where, block)
        else:
            raise bad_request(f"{where}: a user message cannot hold a {block.type} block", "messages")
    flush()
    return out or [{"role": "user", "content": ""}]


def _assistant(i: int, blocks: list[ContentBlock]) -> dict[str, Any]:
    texts, thoughts, calls = [], [], []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            function = {"name": block.name, "arguments": block.input}
            calls.append({"id": block.id, "type": "function", "function": function})
        elif isinstance(block, ThinkingBlock):
            thoughts.append(block.thinking)
        elif isinstance(block, RedactedThinkingBlock):
            continue  # encrypted by Anthropic: nothing a local model can read
        else:
            raise bad_request(
                f"message {i}, content block {j}: an assistant message cannot hold a {block.type} block",
                "messages",
            )
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "\n".join(texts) if texts or not calls else None,
    }
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(
    system: str | list[TextBlock] | None,
    messages: list[Message],
    images: Literal["drop", "refuse"] = "refuse",
) -> tuple[list[dict[str, Any]], int]:
    """Anthropic `system` + `messages` as OpenAI-shaped chat messages (module docstring for the rules),
    and how many image or document blocks were dropped."""
    policy = _Images(images)
    if not messages:
        raise bad_request("messages is empty; send at least one user message", "messages")
    if messages[-1].role == "assistant":
        # Continuing a prefilled assistant turn needs the template to leave the turn open; strata's
        # templates always close it, so the reply would not continue the prefill as Anthropic's would.
        raise bad_request(
            "the last message is from the assistant; continuing a prefilled assistant turn is not "
            "supported yet: end the conversation with a user message",
            "messages",
        )
    out: list[dict[str, Any]] = []
    sys_text = system if isinstance(system, str | None) else _joined_text(system, "system", policy)
    if sys_text:
        out.append({"role": "system", "content": sys_text})
    for i, m in enumerate(messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "system":
            out.append({"role": "system", "content": _joined_text(m.content, f"message {i}", policy)})
        elif m.role == "user":
            out += _user(i, m.content, policy)
        else:
            out.append(_assistant(i, m.content))
    return out, policy.dropped


def chat_tools(tools: list[Tool] | None, choice: ToolChoice | None) -> list[dict[str, Any]] | None:
    """Anthropic tools as OpenAI-shaped function tools; None when there are none or tool_choice is none."""
    if choice is not None and choice.type in ("any", "tool"):
        raise bad_request(
            f"tool_choice {choice.type!r} forces a tool call, which needs constrained decoding; strata does "
            "not have it yet: use 'auto' or 'none'",
            "tool_choice",
        )
    if not tools or (choice is not None and choice.type == "none"):
        return None
    out = []
    for j, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise bad_request(
                f"tool {j} ({tool.name!r}) is Anthropic's server tool {tool.type!r}, which strata does not "
                "run; define it as a custom tool with an input_schema",
                "tools",
            )
        if tool.input_schema is None:
            raise bad_request(f"tool {j} ({tool.name!r}) has no input_schema", "tools")
        function: dict[str, Any] = {"name": tool.name}  # OpenAI's key order: templates dump it as is
        if tool.description is not None:
            function["description"] = tool.description
        out.append({"type": "function", "function": function | {"parameters": tool.input_schema}})
    return out


def sampling_params(
    req: MessagesRequest, max_tokens: int | None, defaults: SamplingDefaults
) -> SamplingParams:
    """The request's sampling; `max_tokens` is passed in as the server clamps it to the context.
    Fields the request leaves out take the per-model `defaults`, then Anthropic's."""
    if (req.output_config or {}).get("format") is not None:
        raise bad_request(
            "output_config.format (structured outputs) needs constrained decoding, which strata does not "
            "have yet; drop it or ask for JSON in the prompt",
            "output_config",
        )
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=defaults.pick("temperature", req.temperature, 1.0),  # Anthropic's default: 1
            top_p=defaults.pick("top_p", req.top_p, 1.0),
            top_k=defaults.pick("top_k", req.top_k, 0),
            min_p=defaults.pick("min_p", None, 0.0),
            repetition_penalty=defaults.pick("repetition_penalty", None, 1.0),
            stop=tuple(req.stop_sequences or ()),
        )
    except ValueError as e:
        raise bad_request(str(e)) from None


def thinking_request(req: CountTokensRequest) -> ThinkingRequest:
    """Anthropic's `thinking`: off unless enabled (or adaptive); its budget when it gives one."""
    on = req.thinking is not None and req.thinking.type != "disabled"
    return ThinkingRequest(
        enabled=on, budget_tokens=req.thinking.budget_tokens if on and req.thinking else None
    )


def to_chat(
    req: CountTokensRequest,
    sampling: SamplingParams,
    thinking: ThinkingRequest,
    images: Literal["drop", "refuse"] = "refuse",
) -> ChatRequest:
    """The internal chat for a request; `images` says what to do with image and document blocks."""
    tools = chat_tools(req.tools, req.tool_choice)
    messages, dropped = chat_messages(req.system, req.messages, images)
    return ChatRequest(messages, sampling, tools, {}, thinking, tuple(note_dropped(dropped)))
