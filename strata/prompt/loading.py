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
    source = ChatTemplate.builtin(builtin_template).source  # an unknown name raises, listing the known
    return tokenizer, template_for(source, tokenizer)


def template_for(source: str, tokenizer: Tokenizer) -> ChatTemplate:
    """A chat template from Jinja source, with this tokenizer's bos and eos pieces."""

    def piece(token_id: int | None) -> str:
        return tokenizer.id_to_piece(token_id) if token_id is not None else ""

    return ChatTemplate(source, bos_token=piece(tokenizer.bos_id), eos_token=piece(tokenizer.eos_id))
