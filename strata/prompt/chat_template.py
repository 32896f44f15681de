"""Rendering a model's Jinja chat template, as transformers' `apply_chat_template(tokenize=False)` does.

Templates come from downloaded files, so they are untrusted code: they run in Jinja's immutable
sandbox, see only plain JSON-like copies of the inputs, and get the same small set of helpers
transformers gives them (`raise_exception`, `strftime_now`, an HTML-unescaped `tojson`).

`render_prompt` also says which characters of the prompt came from outside the template (message
text, tool schemas and calls, template arguments): it renders a second time with every external
string replaced by a tracked stand-in (`strata.prompt.tracked.TrackedStr`), swaps the originals back
in where the stand-ins landed, and requires the result to be exactly the plain rendering. Text that
the template copies verbatim, cuts (strip, trim, split, slices, indexing) or serializes with `tojson`
is tracked; anything else it does with external text that reaches the prompt (upper, replace, a
step slice, string operations strata cannot follow) makes the call fail, never mis-mark.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.runtime
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from strata.prompt.builtin_templates import BUILTIN_TEMPLATES
from strata.prompt.messages import TemplateError, plain_copy, prepare_chat
from strata.prompt.rendered import RenderedPrompt
from strata.prompt.tracked import ACTIVE, MARKS, Ext, Registry, TrackedStr, Untracked, external_json, track

if TYPE_CHECKING:
    from strata.prompt.tokenizer import Tokenizer

__all__ = ["ChatTemplate", "TemplateError"]


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
    def dump(v: Any) -> str:
        return json.dumps(
            v, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    return external_json(value, dump) or dump(value)


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


def _concat(parts: Iterable[str]) -> str:
    # Jinja joins output (the whole template's, a macro's, a {% set %} block's) with this. In a
    # protected rendering the joined sentinels become tracked text again, so a macro's result can
    # still be split or stripped the way the real text would be.
    text = "".join(parts)
    reg = ACTIVE.get()
    return text if reg is None else reg.lift(text)


def _lifting(f: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose string results (say |join's) are tracked again when they hold sentinels."""

    @functools.wraps(f)  # keeps Jinja's pass_context & co. markers
    def lifted(*args: Any, **kwargs: Any) -> Any:
        out = f(*args, **kwargs)
        reg = ACTIVE.get()
        return out if reg is None or not isinstance(out, str) else reg.lift(out)

    return lifted


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters = {name: _lifting(f) for name, f in env.filters.items()}
    env.filters["tojson"] = _tojson
    env.concat = _concat  # type: ignore[method-assign]
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        dict=_TemplateDict(),
        namespace=_TemplateNamespace,
    )
    return env


def _loops_over_content(ast: jinja2.nodes.Template) -> bool:
    """Whether the template has a `for` over a message's content (so it takes lists of parts): over
    `x.content`, `x['content']` or a variable named like content (say a macro's argument)."""
    for loop in ast.find_all(jinja2.nodes.For):
        for node in [loop.iter, *loop.iter.find_all(jinja2.nodes.Node)]:
            if isinstance(node, jinja2.nodes.Getattr) and node.attr == "content":
                return True
            if isinstance(node, jinja2.nodes.Getitem) and getattr(node.arg, "value", None) == "content":
                return True
            if isinstance(node, jinja2.nodes.Name) and "content" in node.name:
                return True
    return False


def _failing_message(exc: BaseException, messages: list[dict[str, Any]]) -> str:
    """`" at message i"` when `exc` was raised inside the template's loop over message i, else ""."""
    index = {id(m): i for i, m in enumerate(messages)}
    found = None
    tb = exc.__traceback__
    while tb is not None:  # outermost frame first, so the innermost loop wins
        for value in tb.tb_frame.f_locals.values():
            if isinstance(value, jinja2.runtime.LoopContext):
                found = index.get(id(getattr(value, "_current", None)), found)
        tb = tb.tb_next
    return "" if found is None else f" at message {found}"


def _refusal(label: str | None, why: str) -> str:
    return (
        f"the chat template did not copy {label or 'external text'} into the prompt verbatim ({why}); "
        "strata cannot mark it as plain text, so the request is refused. For trusted clients, render with "
        "protect=False (start the server with --trust-prompts)"
    )


class ChatTemplate:
    """A compiled chat template: `render(messages)` gives the prompt text, `render_prompt` also the
    ranges of it that came from outside the template."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        env = _environment()
        try:
            self._template = env.from_string(source)
            self._parts_as_lists = _loops_over_content(env.parse(source))
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template does not compile: {exc}") from exc
        # Sentinel characters in the template's own text could pass for tracked text.
        self._has_marks = bool(MARKS.search(source + bos_token + eos_token))

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any], tokenizer: Tokenizer) -> ChatTemplate | None:
        """The file's `tokenizer.chat_template`, or None when it has none (see `builtin`)."""
        source = metadata.get("tokenizer.chat_template")
        if not source:
            return None

        def piece(token_id: int | None) -> str:
            return tokenizer.id_to_piece(token_id) if token_id is not None else ""

        return cls(source, bos_token=piece(tokenizer.bos_id), eos_token=piece(tokenizer.eos_id))

    @classmethod
    def builtin(cls, name: str, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """One of strata's own templates (`strata.prompt.builtin_templates`), e.g. "chatml"."""
        if name not in BUILTIN_TEMPLATES:
            raise TemplateError(
                f"no built-in chat template named {name!r}; "
                f"the built-in ones are {', '.join(sorted(BUILTIN_TEMPLATES))}"
            )
        return cls(BUILTIN_TEMPLATES[name], bos_token=bos_token, eos_token=eos_token)

    def render(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The prompt for `messages` (dicts with "role", "content", maybe "tool_calls", ...).

        The chat is checked and normalized first (`strata.prompt.messages`): a malformed one raises
        TemplateError naming the message. `template_kwargs` (e.g. `enable_thinking=False`) are passed
        to the template and override `bos_token`/`eos_token`.
        """
        chat, tools = prepare_chat(messages, tools, join_text_parts=not self._parts_as_lists)
        return self._render(self._context(chat, tools, add_generation_prompt, plain_copy(template_kwargs)))

    def render_prompt(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        protect: bool = True,
        **template_kwargs: Any,
    ) -> RenderedPrompt:
        """`render`'s text, with every character that came from outside the template marked plain.

        External means message content and text parts, tool results, tool calls (names, arguments),
        reasoning, names and every other message field but `role`, everything in `tools`, and the
        string values of `template_kwargs`. Raises TemplateError rather than mark anything wrongly.
        `protect=False` marks nothing: an operator's explicit opt-out for trusted clients.
        """
        chat, tools = prepare_chat(messages, tools, join_text_parts=not self._parts_as_lists)
        kwargs = plain_copy(template_kwargs)
        text = self._render(self._context(chat, tools, add_generation_prompt, kwargs))
        if not protect:
            return RenderedPrompt.trusted(text)
        if self._has_marks:
            raise TemplateError(
                "the chat template (or its bos/eos token) contains the private-use characters "
                "U+10FF00-U+10FF0F, U+10FFF0 or U+10FFF1, which strata reserves for tracking text; "
                "it cannot protect prompts from this template (protect=False renders unprotected)"
            )
        reg = Registry()
        messages = [
            # Roles stay plain: they are checked to be one of a few words, and templates branch on them.
            {
                track(k, reg, f"message {i}'s fields"): v
                if k == "role"
                else track(v, reg, f"message {i}'s {k}")
                for k, v in m.items()
            }
            for i, m in enumerate(chat)
        ]
        marked = self._context(
            messages,
            None if tools is None else [track(t, reg, f"tool {j}'s schema") for j, t in enumerate(tools)],
            add_generation_prompt,
            {k: track(v, reg, f"template argument {k!r}") for k, v in kwargs.items()},
        )
        token = ACTIVE.set(reg)
        try:
            out = self._template.render(**marked)
        except Untracked as exc:
            raise TemplateError(_refusal(exc.label, exc.why)) from exc
        except Exception as exc:  # it rendered plainly, so tracking made the difference
            raise TemplateError(_refusal(None, f"the template failed on tracked text: {exc}")) from exc
        finally:
            ACTIVE.reset(token)
        return _verified(out, text)

    def _context(
        self, chat: list[Any], tools: Any, add_generation_prompt: bool, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **kwargs,
            "messages": chat,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }

    def _render(self, context: dict[str, Any]) -> str:
        try:
            return self._template.render(**context)
        except TemplateError as exc:  # raise_exception
            where = _failing_message(exc, context["messages"])
            raise TemplateError(f"the chat template refused the conversation{where}: {exc}") from exc
        except (
            jinja2.TemplateError,
            TypeError,
            ValueError,
            LookupError,
            AttributeError,
            ArithmeticError,
        ) as exc:
            raise TemplateError(
                f"the chat template failed{_failing_message(exc, context['messages'])}: {exc}"
            ) from exc


def _verified(out: str, text: str) -> RenderedPrompt:
    """The protected rendering `out` with its originals swapped back in, checked to be exactly `text`."""
    pieces = list(out._pieces) if isinstance(out, TrackedStr) else [out]
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    at = 0
    for p in pieces:
        if isinstance(p, Ext):
            if p.poison:
                raise TemplateError(_refusal(p.label, f"it was changed by {p.poison}"))
            if spans and spans[-1][1] == at:
                spans[-1] = (spans[-1][0], at + len(p.text))
            else:
                spans.append((at, at + len(p.text)))
        elif MARKS.search(p):
            raise TemplateError(_refusal(_label_near(pieces, at), "it was cut in a way strata cannot follow"))
        parts.append(p.text if isinstance(p, Ext) else p)
        at += len(parts[-1])
    rebuilt = "".join(parts)
    if rebuilt != text:
        k = next(
            (i for i, (a, b) in enumerate(zip(rebuilt, text, strict=False)) if a != b),
            min(len(rebuilt), len(text)),
        )
        raise TemplateError(
            _refusal(_label_near(pieces, k), "the prompt differs from the plain rendering there")
        )
    return RenderedPrompt(text, tuple(spans))


def _label_near(pieces: list[Any], index: int) -> str | None:
    """The source of the last external run starting at or before `index` of the rebuilt text, else of
    the first one after it."""
    at, before, after = 0, None, None
    for p in pieces:
        if isinstance(p, Ext):
            if at <= index:
                before = p.label
            elif after is None:
                after = p.label
        at += len(p.text if isinstance(p, Ext) else p)
    return before or after
