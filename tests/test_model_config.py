"""Per-model serving config: shipped files load, bad files name the field, defaults apply under requests."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from strata.engine.sampler import SamplingParams
from strata.model_store import PACKAGED_MODELS
from strata.server.model_config import (
    CONFIG_DIR,
    ConfigError,
    ModelServingConfig,
    SamplingDefaults,
    shipped_config,
)
from strata.server.openai.params import sampling_params
from strata.server.openai.protocol import CompletionRequest


def test_every_packaged_model_ships_a_config_that_loads() -> None:
    for name in PACKAGED_MODELS:
        assert (CONFIG_DIR / f"{name}.json").is_file(), name
        assert shipped_config(name).source.endswith(f"{name}.json")
    coder = shipped_config("qwen2.5-coder-0.5b").sampling
    assert (coder.temperature, coder.top_p, coder.top_k, coder.repetition_penalty) == (0.7, 0.8, 20, 1.05)
    assert shipped_config("some-other-model") == ModelServingConfig()


def test_request_fields_override_the_config_defaults() -> None:
    defaults = shipped_config("qwen2.5-coder-0.5b").sampling
    plain = sampling_params(CompletionRequest(prompt="x"), 100, 8, defaults)
    assert (plain.temperature, plain.top_p, plain.top_k, plain.repetition_penalty) == (0.7, 0.8, 20, 1.05)
    asked = sampling_params(CompletionRequest(prompt="x", temperature=0, top_k=0), 100, 8, defaults)
    assert (asked.temperature, asked.top_k, asked.top_p) == (0.0, 0, 0.8)
    none = sampling_params(CompletionRequest(prompt="x"), 100, 8, SamplingDefaults())
    assert (none.temperature, none.top_p, none.top_k, none.repetition_penalty) == (1.0, 1.0, 0, 1.0)


def test_two_sampling_sets_pick_by_thinking() -> None:
    config = ModelServingConfig.from_dict(
        {"sampling": {"temperature": 0.7}, "thinking_sampling": {"temperature": 0.6, "top_p": 0.95}}, "t"
    )
    assert config.sampling_for(thinking=False).temperature == 0.7
    assert config.sampling_for(thinking=True) == SamplingDefaults(temperature=0.6, top_p=0.95)


@pytest.mark.parametrize(
    "raw, match",
    [
        ({"temprature": 1}, "unknown field.*temprature"),
        ({"sampling": {"temperature": "hot"}}, "sampling.temperature is 'hot'"),
        ({"sampling": {"top_p": 3}}, "sampling: top_p"),
        ({"sampling": {"top_k": 1.5}}, "sampling.top_k"),
        ({"images": "maybe"}, 'images is .maybe.; it must be "drop" or "refuse"'),
        ({"fit_max_tokens": 1}, "fit_max_tokens is 1; it must be a bool"),
        ({"context_size": 0}, "context_size is 0"),
        ({"reasoning": {"start": ""}}, "reasoning.start"),
        ([], "must be a JSON object"),
    ],
)
def test_bad_configs_name_the_file_and_field(raw: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        ModelServingConfig.from_dict(raw, "my.json")
    assert "my.json" in str(info.value)


def test_files_and_slot_clamp(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"conversation_slots": 500, "answer_room": False, "chat_template": "chatml"}))
    with caplog.at_level(logging.WARNING):
        config = ModelServingConfig.load(path)
    assert config.conversation_slots == 16 and "using the maximum, 16" in caplog.text
    assert config.answer_room is False and config.chat_template == "chatml"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelServingConfig.load(path)
    with pytest.raises(ConfigError, match="does not exist"):
        ModelServingConfig.load(tmp_path / "missing.json")


def test_config_sampling_is_checked_like_a_request() -> None:
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    with pytest.raises(ConfigError, match="temperature"):
        ModelServingConfig.from_dict({"sampling": {"temperature": -1}}, "x")
