"""Prompt text <-> tokens: the GGUF file's tokenizer and chat template."""

from strata.prompt.chat_template import ChatTemplate, TemplateError
from strata.prompt.tokenizer import StreamDecoder, Tokenizer

__all__ = ["ChatTemplate", "StreamDecoder", "TemplateError", "Tokenizer"]
