"""What the `strata` subcommands do, once the CLI has parsed their arguments."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from strata.engine.llm import LLM, ModelConfig
from strata.engine.llm_engine import EngineConfig
from strata.engine.sampler import SamplingParams
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.gguf.summary import summarize
from strata.layers.linear import dense_copy_bytes
from strata.prompt.chat_template import ChatTemplate, TemplateError
from strata.prompt.inspect_tokens import TokenRows, load_chat
from strata.prompt.loading import load_prompt_side
from strata.prompt.rendered import RenderedPrompt
from strata.prompt.safe_encode import encode_prompt
from strata.prompt.stream_decoder import StreamDecoder
from strata.server.config import ServerConfig
from strata.server.model_config import ModelServingConfig


@dataclass(frozen=True)
class GenerateRequest:
    text: str
    chat: bool
    sampling: SamplingParams
    protect: bool = True  # encode message content with special-token parsing off


@dataclass(frozen=True)
class TokenizeRequest:
    text: str | None  # raw text, or None when `chat_file` is given
    chat_file: Path | None
    as_json: bool
    protect: bool = True  # chat: message content is plain text (special-token parsing off)
    plain_text: bool = False  # raw text: treat it all as plain, as if a user had sent it
    builtin_template: str | None = None


def info(path: Path, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    gguf = GGUFFile(path)
    rows = summarize(gguf, ModelSpec.from_gguf(gguf))
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}", file=out)


def prompt_ids(llm: LLM, text: str, chat: bool, protect: bool = True) -> list[int]:
    """Raw text as the model's tokens (BOS added when the vocab asks), or one user turn via the template.

    Raw text is the operator's own, so special-token strings in it are honoured; through the template,
    the user's text is plain and can never become a special token unless `protect` is off.
    """
    if not chat:
        return llm.tokenizer.encode(text, add_special=True)
    template = _require_template(llm.chat_template, llm.config.path.name)
    rendered = template.render_prompt([{"role": "user", "content": text}], protect=protect)
    return list(encode_prompt(llm.tokenizer, rendered).ids)


def _require_template(template: ChatTemplate | None, model_name: str) -> ChatTemplate:
    if template is None:
        raise TemplateError(
            f"{model_name} has no chat template (tokenizer.chat_template); use --chat-template chatml "
            "for the built-in ChatML template, or drop --chat to use raw text"
        )
    return template


def tokenize(path: Path, request: TokenizeRequest, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    gguf = GGUFFile(path)
    tokenizer, template = load_prompt_side(gguf.metadata, request.builtin_template)
    if request.chat_file is not None:
        messages, tools = load_chat(request.chat_file)
        prompt = _require_template(template, path.name).render_prompt(
            messages, tools=tools, protect=request.protect
        )
    else:
        text = request.text or ""
        prompt = RenderedPrompt.untrusted(text) if request.plain_text else RenderedPrompt.trusted(text)
    rows = TokenRows.of(tokenizer, encode_prompt(tokenizer, prompt))
    print(rows.to_json() if request.as_json else "\n".join(rows.table(tokenizer)), file=out)


def generate(config: ModelConfig, request: GenerateRequest, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    llm = LLM(config, progress=True)
    try:
        ids = prompt_ids(llm, request.text, request.chat, request.protect)
        decoder = StreamDecoder(llm.tokenizer)
        for token in llm.generate(ids, request.sampling):
            out.write(decoder.push(token))
            out.flush()
        out.write(decoder.flush() + "\n")
    finally:
        llm.close()  # ends the tensor-parallel followers, if any
    s = llm.stats
    print(
        f"[{s.prompt_tokens} prompt tokens, prefill {s.prefill_s * 1e3:.0f} ms "
        f"({s.prefill_tok_s:.1f} tok/s); "
        f"{s.generated_tokens} generated, decode {s.decode_tok_s:.2f} tok/s; finish: {s.finish_reason}]",
        file=sys.stderr,
    )


def serve(
    model: ModelConfig, engine: EngineConfig, server: ServerConfig, model_config: ModelServingConfig
) -> None:
    """Load the model, start the engine thread and serve HTTP until interrupted."""
    import uvicorn

    from strata.server.runtime import build_runtime

    runtime = build_runtime(model, engine, server, model_config, progress=True)
    base = f"http://{server.host}:{server.port}"
    auth = ' -H "Authorization: Bearer $STRATA_API_KEY"' if server.api_key else ""
    body = '{"messages": [{"role": "user", "content": "Write hello world in Python"}]}'

    copies = dense_copy_bytes(runtime.llm.model)

    @runtime.app.on_event("startup")
    async def announce() -> None:
        print(f"strata: serving {model.path.name} as {server.model_name!r} on {base}", file=sys.stderr)
        if copies:
            print(
                f"  dense copies of the weights for batched steps: {copies / 2**30:.1f} GiB "
                "(STRATA_DENSE_COPY=0 leaves them out)",
                file=sys.stderr,
            )
        print(
            f"  curl {base}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'",
            file=sys.stderr,
        )

    try:
        uvicorn.run(runtime.app, host=server.host, port=server.port, log_level="warning")
    finally:
        runtime.close()
