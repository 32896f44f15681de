"""OpenAI request fields to strata's `SamplingParams`, refusing what strata cannot honour yet."""

from __future__ import annotations

import math
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from strata.engine.sampler import SamplingParams
from strata.server.errors import bad_request
from strata.server.model_config import SamplingDefaults
from strata.server.openai.protocol import ChatCompletionRequest, SamplingFields

_MAX_BIAS = 100.0


def logit_bias(raw: dict[str, Any] | None, vocab_size: int) -> MappingProxyType[int, float]:
    """Keys are token ids (ints as decimal strings), values finite numbers in [-100, 100]."""
    if not raw:
        return MappingProxyType({})
    for key, value in raw.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise bad_request(f"logit_bias[{key}] = {value!r} is not a finite number", "logit_bias")
    return _normalized_bias(tuple(raw.items()), vocab_size)


@lru_cache(maxsize=256)  # keyed by content: clients resend the same bias with every turn
def _normalized_bias(items: tuple[tuple[str, Any], ...], vocab_size: int) -> MappingProxyType[int, float]:
    bias: dict[int, float] = {}
    for key, value in items:
        if not (isinstance(key, str) and key.isascii() and key.isdecimal()):
            raise bad_request(f"logit_bias key {key!r} is not a token id (an integer >= 0)", "logit_bias")
        token = int(key)
        if token >= vocab_size:
            raise bad_request(
                f"logit_bias key {key} is outside the vocabulary (ids 0..{vocab_size - 1})", "logit_bias"
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise bad_request(f"logit_bias[{key}] = {value!r} is not a finite number", "logit_bias")
        if abs(value) > _MAX_BIAS:
            raise bad_request(f"logit_bias[{key}] = {value} is outside [-100, 100]", "logit_bias")
        bias[token] = float(value)
    return MappingProxyType(bias)


def sampling_params(
    req: SamplingFields,
    vocab_size: int,
    max_tokens: int | None,
    defaults: SamplingDefaults,
    top_logprobs: int = 0,
) -> SamplingParams:
    """The request's sampling; fields it leaves out take the per-model `defaults`, then OpenAI's."""
    if req.n not in (None, 1):
        raise bad_request(f"n = {req.n} is not supported; strata returns one choice per request (n = 1)", "n")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    fields: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": defaults.pick("temperature", req.temperature, 1.0),
        "top_p": defaults.pick("top_p", req.top_p, 1.0),
        "top_k": defaults.pick("top_k", req.top_k, 0),
        "min_p": defaults.pick("min_p", req.min_p, 0.0),
        "presence_penalty": defaults.pick("presence_penalty", req.presence_penalty, 0.0),
        "frequency_penalty": defaults.pick("frequency_penalty", req.frequency_penalty, 0.0),
        "repetition_penalty": defaults.pick("repetition_penalty", req.repetition_penalty, 1.0),
        "seed": req.seed,
        "stop": stop,
        "logit_bias": logit_bias(req.logit_bias, vocab_size),
        "logprobs": bool(req.logprobs),
        "top_logprobs": top_logprobs,
    }
    try:
        return SamplingParams(**fields)
    except ValueError as e:
        raise bad_request(str(e)) from None


def chat_sampling_params(
    req: ChatCompletionRequest, vocab_size: int, defaults: SamplingDefaults
) -> SamplingParams:
    if req.response_format and req.response_format.get("type") not in (None, "text"):
        raise bad_request(
            f"response_format {req.response_format.get('type')!r} needs constrained decoding, which strata "
            "does not have yet; drop response_format or ask for JSON in the prompt",
            "response_format",
        )
    choice = req.tool_choice
    if isinstance(choice, dict) or choice == "required":
        raise bad_request(
            "tool_choice 'required' or a named tool needs constrained decoding, which strata does not have "
            "yet; use 'auto' or 'none'",
            "tool_choice",
        )
    if choice not in (None, "auto", "none"):
        raise bad_request(f"tool_choice {choice!r} is not one of 'none', 'auto'", "tool_choice")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    return sampling_params(req, vocab_size, max_tokens, defaults, req.top_logprobs or 0)
