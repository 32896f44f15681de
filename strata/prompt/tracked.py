"""Tracked strings: the stand-ins for external text while a chat template renders under protection."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, SupportsIndex

# Protected rendering replaces every external string with a TrackedStr. Its characters (what C code
# such as str.join or json.dumps reads) are a sentinel: private-use code points naming an entry of the
# rendering's Registry, never the external text itself, so the template cannot copy external text into
# its output except as a sentinel, which strata then swaps back and marks plain. Its methods answer as
# the real text would (len, ==, in, startswith...), so control flow follows the plain rendering; the
# ones that cut the text (strip, split, slices) return tracked pieces, and the ones that change it
# (upper, replace...) return text marked poisoned, which is refused if it reaches the output.
_DIGIT0 = 0x10FF00
OPEN, CLOSE = "\U0010fff0", "\U0010fff1"
MARKS = re.compile("[\U0010ff00-\U0010ff0f\U0010fff0\U0010fff1]")
_SENTINEL = re.compile("\U0010fff0([\U0010ff00-\U0010ff0f]+)\U0010fff1")


@dataclass(frozen=True, eq=False)
class Ext:
    """A run of external text, where it came from, and (if so) why it cannot be marked plain."""

    text: str
    label: str
    poison: str | None = None


Piece = str | Ext  # a str piece is the template's own text


class Untracked(Exception):
    """A template used external text in a way that cannot be tracked (raised inside rendering)."""

    def __init__(self, label: str, why: str) -> None:
        super().__init__(f"{label}: {why}")
        self.label, self.why = label, why


class Registry:
    """The external runs of one protected rendering, each named by a sentinel."""

    def __init__(self) -> None:
        self._exts: list[Ext] = []
        self._ids: dict[Ext, int] = {}

    def sentinel(self, ext: Ext) -> str:
        n = self._ids.get(ext)
        if n is None:
            n = self._ids[ext] = len(self._exts)
            self._exts.append(ext)
        return OPEN + "".join(chr(_DIGIT0 + int(h, 16)) for h in f"{n:x}") + CLOSE

    def pieces(self, text: str) -> list[Piece]:
        """`text` split into the template's own text and the runs its sentinels name."""
        out: list[Piece] = []
        at = 0
        for m in _SENTINEL.finditer(text):
            n = int("".join(f"{ord(c) - _DIGIT0:x}" for c in m.group(1)), 16)
            if n < len(self._exts):  # an unknown one stays as text, and fails the final check
                out += [text[at : m.start()], self._exts[n]]
                at = m.end()
        out.append(text[at:])
        return out

    def lift(self, text: str) -> str:
        """`text` (maybe holding sentinels, say from str.join) as a TrackedStr when it holds any."""
        return make(self, self.pieces(text)) if OPEN in text and type(text) is str else text


ACTIVE: ContextVar[Registry | None] = ContextVar("strata_chat_registry", default=None)


def make(reg: Registry, pieces: Iterable[Piece]) -> str:
    """The string made of `pieces`: a TrackedStr when any is external, else a plain str."""
    out: list[Piece] = []
    for p in pieces:
        if not (p if isinstance(p, str) else p.text):
            continue  # nothing to show, nothing to mark
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        else:
            out.append(p)
    buffer = "".join(p if isinstance(p, str) else reg.sentinel(p) for p in out)
    if all(isinstance(p, str) for p in out):
        return buffer
    tracked = str.__new__(TrackedStr, buffer)
    tracked._reg, tracked._pieces = reg, tuple(out)
    tracked._value = "".join(p if isinstance(p, str) else p.text for p in out)
    return tracked


def track(value: Any, reg: Registry, label: str) -> Any:
    """`value` with every string in it, dict keys too, replaced by its tracked stand-in."""
    if isinstance(value, str):
        return make(reg, [Ext(value, label)])
    if isinstance(value, dict):
        return {track(k, reg, label): track(v, reg, label) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(track(v, reg, label) for v in value)
    return value


def external_json(value: Any, dump: Callable[[Any], str]) -> str | None:
    """In a protected rendering, `dump(value)` as one external run if `value` holds external text."""
    reg = ACTIVE.get()
    if reg is None:
        return None
    found: list[Ext] = []
    real = _real(value, reg, found)
    if not found:
        return None
    poison = next((e.poison for e in found if e.poison), None)
    return make(reg, [Ext(dump(real), found[0].label, poison)])


def _real(value: Any, reg: Registry, found: list[Ext]) -> Any:
    if isinstance(value, str):
        value = reg.lift(value)
        if isinstance(value, TrackedStr):
            found.extend(p for p in value._pieces if isinstance(p, Ext))
            return value._value
        return value
    if isinstance(value, dict):
        return {_real(k, reg, found): _real(v, reg, found) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_real(v, reg, found) for v in value]
    return value


class TrackedStr(str):
    """An external string, or text built from some, during protected rendering (the note above)."""

    _reg: Registry
    _pieces: tuple[Piece, ...]
    _value: str  # the real text

    def __new__(cls, value: object = "") -> str:  # type: ignore[misc]
        # `TrackedStr(x)`, as the sandbox's str.format wrapper calls it on its result, is plain text
        # (tracked again if it holds sentinels); `make` builds real ones.
        text = value if type(value) is str else str.__str__(str(value))
        reg = ACTIVE.get()
        return text if reg is None else reg.lift(text)

    def _val(self, x: Any) -> Any:
        if isinstance(x, tuple):
            return tuple(self._val(v) for v in x)
        if isinstance(x, str):
            x = self._reg.lift(x)
        return x._value if isinstance(x, TrackedStr) else x

    def _pieces_of(self, x: str) -> list[Piece]:
        return list(x._pieces) if isinstance(x, TrackedStr) else self._reg.pieces(x)

    def _label(self) -> str:
        return next(p.label for p in self._pieces if isinstance(p, Ext))

    def _cut(self, start: int, stop: int) -> str:
        """The tracked text of `self._value[start:stop]`."""
        out: list[Piece] = []
        at = 0
        for p in self._pieces:
            text = p if isinstance(p, str) else p.text
            lo, hi = max(start - at, 0), min(stop - at, len(text))
            if lo < hi:
                if isinstance(p, str):
                    out.append(text[lo:hi])
                else:
                    out.append(p if hi - lo == len(text) else Ext(text[lo:hi], p.label, p.poison))
            at += len(text)
        return make(self._reg, out)

    def _poisoned(self, value: str, why: str) -> str:
        return make(self._reg, [Ext(value, self._label(), why)])

    def _locate(self, parts: list[str], sep: str | None, from_right: bool) -> list[str]:
        # Where each part of a split lies: after the separator, or (whitespace splits) at the first
        # match, which cannot begin inside the run of whitespace before the part.
        v, gap, out = self._value, len(sep) if sep is not None else 0, []
        at = len(v) if from_right else 0
        for part in reversed(parts) if from_right else parts:
            if from_right:
                start = at - len(part) if sep is not None else v.rfind(part, 0, at)
                at = start - gap
            else:
                start = at if sep is not None else v.find(part, at)
                at = start + len(part) + gap
            out.append(self._cut(start, start + len(part)))
        return out[::-1] if from_right else out

    def split(self, sep: str | None = None, maxsplit: SupportsIndex = -1) -> list[str]:  # type: ignore[override]
        sep = self._val(sep)
        return self._locate(self._value.split(sep, maxsplit), sep, False)

    def rsplit(self, sep: str | None = None, maxsplit: SupportsIndex = -1) -> list[str]:  # type: ignore[override]
        sep = self._val(sep)
        return self._locate(self._value.rsplit(sep, maxsplit), sep, True)

    def splitlines(self, keepends: bool = False) -> list[str]:  # type: ignore[override]
        out, at = [], 0
        for line in self._value.splitlines(True):
            out.append(self._cut(at, at + (len(line) if keepends else len(line.splitlines()[0]))))
            at += len(line)
        return out

    def partition(self, sep: str) -> tuple[str, str, str]:  # type: ignore[override]
        return self._three(self._value.partition(self._val(sep)))

    def rpartition(self, sep: str) -> tuple[str, str, str]:  # type: ignore[override]
        return self._three(self._value.rpartition(self._val(sep)))

    def _three(self, parts: tuple[str, str, str]) -> tuple[str, str, str]:
        a, b = len(parts[0]), len(parts[0]) + len(parts[1])
        return self._cut(0, a), self._cut(a, b), self._cut(b, len(self._value))

    def _trim(self, chars: str | None, left: bool, right: bool) -> str:
        v, chars = self._value, self._val(chars)
        a = len(v) - len(v.lstrip(chars)) if left else 0
        b = len(v.rstrip(chars)) if right else len(v)
        return self._cut(a, max(a, b))

    def strip(self, chars: str | None = None) -> str:  # type: ignore[override]
        return self._trim(chars, True, True)

    def lstrip(self, chars: str | None = None) -> str:  # type: ignore[override]
        return self._trim(chars, True, False)

    def rstrip(self, chars: str | None = None) -> str:  # type: ignore[override]
        return self._trim(chars, False, True)

    def removeprefix(self, prefix: str) -> str:  # type: ignore[override]
        prefix = self._val(prefix)
        return self._cut(len(prefix) if self._value.startswith(prefix) else 0, len(self._value))

    def removesuffix(self, suffix: str) -> str:  # type: ignore[override]
        suffix, v = self._val(suffix), self._value
        return self._cut(0, len(v) - len(suffix) if suffix and v.endswith(suffix) else len(v))

    def __getitem__(self, key: SupportsIndex | slice) -> str:  # type: ignore[override]
        v = self._value
        piece = v[key]  # raises what str would
        if isinstance(key, slice):
            start, stop, step = key.indices(len(v))
            return self._cut(start, max(start, stop)) if step == 1 else self._poisoned(piece, "a slice step")
        i = operator.index(key)
        i += len(v) if i < 0 else 0
        return self._cut(i, i + 1)

    def __iter__(self) -> Iterator[str]:
        return iter([self._cut(i, i + 1) for i in range(len(self._value))])

    def __reversed__(self) -> Iterator[str]:
        return reversed([self._cut(i, i + 1) for i in range(len(self._value))])

    def __add__(self, other: str) -> str:  # type: ignore[override]
        if not isinstance(other, str):
            return NotImplemented
        return make(self._reg, [*self._pieces, *self._pieces_of(other)])

    def __radd__(self, other: str) -> str:
        if not isinstance(other, str):
            return NotImplemented
        return make(self._reg, [*self._pieces_of(other), *self._pieces])

    def __mul__(self, n: SupportsIndex) -> str:  # type: ignore[override]
        return make(self._reg, list(self._pieces) * operator.index(n))

    __rmul__ = __mul__

    def join(self, iterable: Iterable[str]) -> str:  # type: ignore[override]
        out: list[Piece] = []
        for k, item in enumerate(iterable):
            if not isinstance(item, str):
                raise TypeError(f"sequence item {k}: expected str instance, {type(item).__name__} found")
            out += [*(self._pieces if k else ()), *self._pieces_of(item)]
        return make(self._reg, out)

    def __mod__(self, args: Any) -> str:  # type: ignore[override]
        return self._poisoned(self._value % self._val(args), "% formatting")

    def __str__(self) -> str:
        return self  # so str(x) in filters keeps it tracked

    def __repr__(self) -> str:
        return self._poisoned(repr(self._value), "repr")

    def __format__(self, spec: str) -> str:
        return self if not spec else self._poisoned(format(self._value, spec), "a format spec")

    def encode(self, *args: Any, **kwargs: Any) -> bytes:  # type: ignore[override]
        raise Untracked(self._label(), ".encode()")

    # The sandbox runs .format() and .format_map() on the characters (the sentinel) with its own
    # formatter; these never run the real text as a format string, which could reach attributes.
    def format(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        raise Untracked(self._label(), ".format()")

    def format_map(self, mapping: Any) -> str:  # type: ignore[override]
        raise Untracked(self._label(), ".format_map()")

    def __hash__(self) -> int:
        return hash(self._value)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __int__(self) -> int:
        return int(self._value)

    def __float__(self) -> float:
        return float(self._value)


def _answer(name: str) -> Callable[..., Any]:
    method = getattr(str, name)

    def answer(self: TrackedStr, *args: Any) -> Any:
        return method(self._value, *(self._val(a) for a in args))

    answer.__name__ = name
    return answer


def _transform(name: str) -> Callable[..., str]:
    method = getattr(str, name)

    def transform(self: TrackedStr, *args: Any, **kwargs: Any) -> str:
        return self._poisoned(method(self._value, *(self._val(a) for a in args), **kwargs), f".{name}()")

    transform.__name__ = name
    return transform


# Questions about the text are answered from the real text; changes to it are poisoned.
ANSWERS = (
    *("__len__", "__contains__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"),
    *("startswith", "endswith", "find", "rfind", "index", "rindex", "count", "isalnum", "isalpha"),
    *("isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isprintable"),
    *("isspace", "istitle", "isupper"),
)
TRANSFORMS = (
    *("capitalize", "casefold", "center", "expandtabs", "ljust", "lower"),
    *("replace", "rjust", "swapcase", "title", "translate", "upper", "zfill"),
)
for _name in ANSWERS:
    setattr(TrackedStr, _name, _answer(_name))
for _name in TRANSFORMS:
    setattr(TrackedStr, _name, _transform(_name))
