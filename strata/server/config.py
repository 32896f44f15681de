"""`ServerConfig`: how `strata serve` runs, built once from the command line."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "strata"  # the id /v1/models lists and responses echo
    api_key: str | None = None  # protects every route but /health
    trust_prompts: bool = False  # let message content produce special tokens (trusted clients only)
    conversation_slots: int = 4  # prompts the incremental encoder keeps (capped at 16)
    default_max_tokens: int | None = None  # None: fit, generate up to the room left in the context

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"--port {self.port} is not a TCP port (1-65535)")
        if not 1 <= self.conversation_slots <= 64:
            raise ValueError(f"conversation slots {self.conversation_slots} must be between 1 and 64")
