"""Building the serving stack for one model: weights, engine thread, chat service, app."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI

from strata.engine.async_engine import AsyncEngine
from strata.engine.llm import LLM, ModelConfig
from strata.engine.llm_engine import EngineConfig, LLMEngine
from strata.server.app import create_app
from strata.server.chat_service import ChatService
from strata.server.config import ServerConfig


@dataclass
class Runtime:
    llm: LLM
    engine: AsyncEngine
    service: ChatService
    app: FastAPI

    def close(self) -> None:
        self.engine.close()


def build_runtime(
    model: ModelConfig, engine: EngineConfig, server: ServerConfig, progress: bool = False
) -> Runtime:
    llm = LLM(model, progress=progress)
    async_engine = AsyncEngine(LLMEngine(llm.model, llm.tokenizer, engine)).start()
    service = ChatService(async_engine, llm.tokenizer, llm.chat_template, llm.spec.context_length, server)
    return Runtime(llm, async_engine, service, create_app(service, server))
