"""What `strata generate` and `strata info` do, once the CLI has parsed its arguments."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from strata.engine.llm import LLM, ModelConfig
from strata.engine.sampler import SamplingParams
from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec
from strata.gguf.summary import summarize
from strata.prompt.stream_decoder import StreamDecoder


@dataclass(frozen=True)
class GenerateRequest:
    text: str
    chat: bool
    sampling: SamplingParams


def info(path: Path, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    gguf = GGUFFile(path)
    rows = summarize(gguf, ModelSpec.from_gguf(gguf))
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}", file=out)


def prompt_ids(llm: LLM, text: str, chat: bool) -> list[int]:
    """Raw text as the model's tokens (BOS added when the vocab asks), or one user turn via the template."""
    if not chat:
        return llm.tokenizer.encode(text, add_special=True)
    if llm.chat_template is None:
        raise ValueError(
            f"{llm.config.path.name} has no chat template (tokenizer.chat_template); "
            "drop --chat to generate from raw text"
        )
    rendered = llm.chat_template.render([{"role": "user", "content": text}], add_generation_prompt=True)
    # Special-token-safe encoding of the user's text is the prompt layer's next step.
    return llm.tokenizer.encode(rendered, add_special=False)


def generate(config: ModelConfig, request: GenerateRequest, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    llm = LLM(config, progress=True)
    ids = prompt_ids(llm, request.text, request.chat)
    decoder = StreamDecoder(llm.tokenizer)
    for token in llm.generate(ids, request.sampling):
        out.write(decoder.push(token))
        out.flush()
    out.write(decoder.flush() + "\n")
    s = llm.stats
    print(
        f"[{s.prompt_tokens} prompt tokens, prefill {s.prefill_s * 1e3:.0f} ms "
        f"({s.prefill_tok_s:.1f} tok/s); "
        f"{s.generated_tokens} generated, decode {s.decode_tok_s:.2f} tok/s; finish: {s.finish_reason}]",
        file=sys.stderr,
    )
