"""A request ends with its client: the handler runs beside a listener for the ASGI http.disconnect
message, and a client that leaves first cancels the handler.

A streamed response notices a departed client when it next writes; a plain (non-streamed) one writes
only at the end, and a request still queued in the engine writes nothing at all, so without this both
ran to max_tokens after their client had gone. Cancelling the handler cancels its wait on the engine
stream, which aborts the request and frees its KV blocks (`AsyncEngine.generate`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from starlette.responses import Response

T = TypeVar("T")

CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, but logs say what happened


async def _client_left(request: Request) -> None:
    # The body was read before the handler ran, so the next message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


def cancel_on_disconnect(handler: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T | Response]]:
    """Wrap a route handler that takes `raw_request: Request` (FastAPI fills it in)."""

    @functools.wraps(handler)
    async def run(*args: Any, **kwargs: Any) -> T | Response:
        request: Request = kwargs["raw_request"]
        work = asyncio.ensure_future(handler(*args, **kwargs))
        left = asyncio.ensure_future(_client_left(request))
        try:
            await asyncio.wait((work, left), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server itself is stopping the request
            work.cancel()
            raise
        finally:
            left.cancel()
        if work.done():
            return work.result()
        work.cancel()
        # Let the handler unwind (its engine stream aborts the request) before answering nobody.
        await asyncio.gather(work, return_exceptions=True)
        return Response(status_code=CLIENT_CLOSED)

    return run
