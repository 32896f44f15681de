"""Building the serving stack for one model: weights, engine thread, chat service, app."""

from __future__ import annotations

from dataclasses import dataclass, replace

from fastapi import FastAPI

from strata.engine.async_engine import AsyncEngine
from strata.engine.llm import LLM, ModelConfig
from strata.engine.llm_engine import EngineConfig, LLMEngine
from strata.prompt.builtin_templates import BUILTIN_TEMPLATES
from strata.prompt.loading import template_for
from strata.server.app import create_app
from strata.server.chat_service import ChatService
from strata.server.config import ServerConfig
from strata.server.model_config import ModelServingConfig


@dataclass
class Runtime:
    llm: LLM
    engine: AsyncEngine
    service: ChatService
    app: FastAPI

    def close(self) -> None:
        self.engine.close()
        self.llm.close()  # after the engine thread's last step: ends tensor-parallel followers


def build_runtime(
    model: ModelConfig,
    engine: EngineConfig,
    server: ServerConfig,
    model_config: ModelServingConfig | None = None,
    progress: bool = False,
) -> Runtime:
    """Everything `strata serve` runs. A chat template named on the command line (`model.chat_template`)
    wins over the model config's, which wins over the file's own."""
    model_config = model_config or ModelServingConfig()
    template = model_config.chat_template
    if model.chat_template is None and template in BUILTIN_TEMPLATES:
        model = replace(model, chat_template=template)
    llm = LLM(model, progress=progress)
    try:
        if model.chat_template is None and template is not None:  # Jinja source in the config
            llm.chat_template = template_for(template, llm.tokenizer)
        async_engine = AsyncEngine(LLMEngine(llm.model, llm.tokenizer, engine)).start()
    except BaseException:
        llm.close()
        raise
    service = ChatService(
        async_engine, llm.tokenizer, llm.chat_template, llm.spec.context_length, server, model_config
    )
    return Runtime(llm, async_engine, service, create_app(service, server))
