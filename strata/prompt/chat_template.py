"""Rendering a model's Jinja chat template, as transformers' `apply_chat_template(tokenize=False)` does.

Templates come from downloaded files, so they are untrusted code: they run in Jinja's immutable
sandbox, see only plain JSON-like copies of the inputs, and get the same small set of helpers
transformers gives them (`raise_exception`, `strftime_now`, an HTML-unescaped `tojson`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

if TYPE_CHECKING:
    from strata.prompt.tokenizer import Tokenizer


class TemplateError(ValueError):
    """The chat template failed to compile or render, or called `raise_exception`."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML, which would change what the model sees.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` for templates without handing them the builtin type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore-prefixed names, the way into Python internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's signature trick, so `self=` works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        dict=_TemplateDict(),
        namespace=_TemplateNamespace,
    )
    return env


def _plain(value: Any) -> Any:
    """A copy of `value` made only of JSON-like builtins, so the template sees no foreign methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for kind in (str, int, float):
        if isinstance(value, kind):  # subclasses (enums, numpy floats) may carry extra methods
            return kind(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return f"<{type(value).__name__}>"


class ChatTemplate:
    """A compiled chat template: `render(messages)` gives the prompt text."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template does not compile: {exc}") from exc

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any], tokenizer: Tokenizer) -> ChatTemplate | None:
        """The file's `tokenizer.chat_template`, or None when it has none."""
        source = metadata.get("tokenizer.chat_template")
        if not source:
            return None

        def piece(token_id: int | None) -> str:
            return tokenizer.id_to_piece(token_id) if token_id is not None else ""

        return cls(source, bos_token=piece(tokenizer.bos_id), eos_token=piece(tokenizer.eos_id))

    def render(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The prompt for `messages` (dicts with "role", "content", maybe "tool_calls", ...).

        Keys whose value is None are dropped, as transformers does, since templates test for a
        missing key. `template_kwargs` (e.g. `enable_thinking=False`) are passed to the template and
        override `bos_token`/`eos_token`.
        """
        chat = [{k: v for k, v in _plain(m).items() if v is not None} for m in messages]
        context = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **_plain(template_kwargs),
            "messages": chat,
            "tools": _plain(tools),
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        return self._render(context)

    def _render(self, context: dict[str, Any]) -> str:
        # The one place text is produced. Special-safe rendering (tracking which spans of the
        # output came from message content, so they are encoded with parse_special=False) wraps
        # this step: mark the content strings in `context`, render, then split on the marks.
        try:
            return self._template.render(**context)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template failed: {exc}") from exc
