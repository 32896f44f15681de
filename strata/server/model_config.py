"""Per-model serving configuration: a JSON file per model, shipped for each packaged model.

`strata serve` uses the packaged model's file from `strata/server/model_configs/` unless `--config FILE`
names another. Every field is optional; unknown fields are an error (a typo must not be ignored):

    {
      "context_size": 32768,             # cap on prompt + completion (at most the model's own)
      "sampling": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05},
      "thinking_sampling": {...},        # used instead when the request thinks (cards that give two sets)
      "fit_max_tokens": true,            # no max_tokens: generate up to the room left in the context
      "default_max_tokens": 4096,        # ...or, with fit_max_tokens false, at most this many
      "answer_room": true,               # default reasoning budget keeps room for the answer
      "conversation_slots": 4,           # prompts kept for incremental encoding (clamped to 1..16)
      "images": "drop",                  # a text-only model: "drop" image parts (and say so) or "refuse"
      "chat_template": "chatml-think",   # a built-in template's name, or Jinja source
      "reasoning": {"start": "<think>", "end": "</think>", "wrap_up": "..."}
    }

Request fields override the sampling defaults; a field the request leaves out takes the config's value,
and one neither sets takes the API's usual default (temperature 1, top_p 1, ...).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from strata.engine.sampler import SamplingParams

logger = logging.getLogger(__name__)

MAX_CONVERSATION_SLOTS = 16  # each slot keeps one encoded conversation; more buys nothing measurable
CONFIG_DIR = Path(__file__).parent / "model_configs"


class ConfigError(ValueError):
    """A per-model configuration file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class SamplingDefaults:
    """Sampling values a request falls back to; None leaves the API's own default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def pick(self, name: str, requested: Any, api_default: Any) -> Any:
        """The request's value if it gave one, else this config's, else the API default."""
        if requested is not None:
            return requested
        configured = getattr(self, name)
        return api_default if configured is None else configured


@dataclass(frozen=True)
class ReasoningFormat:
    start: str = "<think>"
    end: str = "</think>"
    # Appended, with `end`, when a reasoning budget is spent; the model then answers from here.
    wrap_up: str = "\n\nI have thought enough; time to answer.\n"


@dataclass(frozen=True)
class ModelServingConfig:
    context_size: int | None = None
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)
    thinking_sampling: SamplingDefaults | None = None
    fit_max_tokens: bool = True
    default_max_tokens: int = 4096
    answer_room: bool = True
    conversation_slots: int = 4
    images: Literal["drop", "refuse"] = "drop"
    chat_template: str | None = None
    reasoning: ReasoningFormat = field(default_factory=ReasoningFormat)
    source: str = "built-in defaults"  # where it came from, for messages and logs

    def sampling_for(self, thinking: bool) -> SamplingDefaults:
        return self.thinking_sampling if thinking and self.thinking_sampling is not None else self.sampling

    @classmethod
    def load(cls, path: Path) -> ModelServingConfig:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"model config {path} does not exist") from None
        except ValueError as e:
            raise ConfigError(f"model config {path} is not valid JSON: {e}") from None
        return cls.from_dict(raw, str(path))

    @classmethod
    def from_dict(cls, raw: Any, source: str) -> ModelServingConfig:
        where = f"model config {source}"
        obj = _object(raw, where, {f.name for f in fields(cls)} - {"source"})
        values: dict[str, Any] = {"source": source}
        for name, value in obj.items():
            key = f"{where}: {name}"
            if name in ("sampling", "thinking_sampling"):
                values[name] = _sampling(value, key)
            elif name == "reasoning":
                values[name] = ReasoningFormat(
                    **_strings(value, key, {f.name for f in fields(ReasoningFormat)})
                )
            elif name in ("fit_max_tokens", "answer_room"):
                values[name] = _typed(value, bool, key)
            elif name == "context_size":
                values[name] = None if value is None else _positive(value, key)
            elif name == "default_max_tokens":
                values[name] = _positive(value, key)
            elif name == "conversation_slots":
                values[name] = _slots(_positive(value, key), key)
            elif name == "images":
                if value not in ("drop", "refuse"):
                    raise ConfigError(f'{key} is {value!r}; it must be "drop" or "refuse"')
                values[name] = value
            elif name == "chat_template":
                values[name] = None if value is None else _typed(value, str, key)
        return cls(**values)


def shipped_config(model_name: str) -> ModelServingConfig:
    """The configuration shipped for a packaged model, or the built-in defaults for any other."""
    path = CONFIG_DIR / f"{model_name}.json"
    return ModelServingConfig.load(path) if path.is_file() else ModelServingConfig()


def _object(raw: Any, where: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a JSON object, not {type(raw).__name__}")
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(
            f"{where} has unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}"
        )
    return raw


def _typed(value: Any, kind: type, key: str) -> Any:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ConfigError(f"{key} is {value!r}; it must be a {kind.__name__}")
    return value


def _positive(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} is {value!r}; it must be a whole number of at least 1")
    return value


def _slots(value: int, key: str) -> int:
    if value > MAX_CONVERSATION_SLOTS:
        logger.warning("%s is %d; using the maximum, %d", key, value, MAX_CONVERSATION_SLOTS)
        return MAX_CONVERSATION_SLOTS
    return value


def _strings(raw: Any, key: str, allowed: set[str]) -> dict[str, str]:
    obj = _object(raw, key, allowed)
    for name, value in obj.items():
        if not isinstance(value, str) or (name != "wrap_up" and not value):
            raise ConfigError(f"{key}.{name} is {value!r}; it must be a non-empty string")
    return obj


def _sampling(raw: Any, key: str) -> SamplingDefaults:
    obj = _object(raw, key, {f.name for f in fields(SamplingDefaults)})
    for name, value in obj.items():
        number = int if name == "top_k" else (int, float)
        if isinstance(value, bool) or not isinstance(value, number):
            raise ConfigError(f"{key}.{name} is {value!r}; it must be a number")
    try:
        SamplingParams(**obj)  # the same range checks a request's values get
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None
    return SamplingDefaults(**obj)
