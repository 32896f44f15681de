"""Errors the server answers with: one internal type, shaped per API family at the edge."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class APIError(Exception):
    """A request the server refuses, with the HTTP status and a message naming input, limit and fix."""

    status: int
    message: str
    kind: str = "invalid_request_error"  # OpenAI's error.type; mapped for Anthropic
    param: str | None = None
    retry_after: int | None = None  # seconds, for 503s

    def __str__(self) -> str:
        return self.message


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param)


def busy(message: str, retry_after: int = 1) -> APIError:
    return APIError(503, message, "overloaded_error", retry_after=retry_after)
