"""A model's prompt side from its GGUF metadata: tokenizer and chat template, with the builtin override."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strata.prompt.chat_template import ChatTemplate
from strata.prompt.tokenizer import Tokenizer


def load_prompt_side(
    metadata: Mapping[str, Any], builtin_template: str | None = None
) -> tuple[Tokenizer, ChatTemplate | None]:
    """The tokenizer, and the file's chat template (or the named built-in one when asked for)."""
    tokenizer = Tokenizer.from_gguf(metadata)
    if builtin_template is None:
        return tokenizer, ChatTemplate.from_gguf(metadata, tokenizer)

    def piece(token_id: int | None) -> str:
        return tokenizer.id_to_piece(token_id) if token_id is not None else ""

    template = ChatTemplate.builtin(builtin_template, piece(tokenizer.bos_id), piece(tokenizer.eos_id))
    return tokenizer, template
