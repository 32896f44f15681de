"""Prompt text <-> tokens: the GGUF file's tokenizer and chat template."""

from strata.prompt.chat_template import ChatTemplate, TemplateError
from strata.prompt.stream_decoder import StreamDecoder
from strata.prompt.tokenizer import Tokenizer

__all__ = ["ChatTemplate", "StreamDecoder", "TemplateError", "Tokenizer"]
