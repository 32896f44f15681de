"""The FastAPI app: routers per API family, auth, and errors shaped like the API they came through."""

from __future__ import annotations

import hmac

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from strata.server.anthropic.serving import AnthropicServing
from strata.server.chat_service import ChatService
from strata.server.config import ServerConfig
from strata.server.errors import APIError
from strata.server.openai.serving import OpenAIServing

_OPEN_ROUTES = frozenset({"/health"})


def _is_anthropic(request: Request) -> bool:
    return request.url.path.startswith("/v1/messages")


def error_response(request: Request, error: APIError) -> JSONResponse:
    headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else None
    if _is_anthropic(request):
        kind = {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            503: "overloaded_error",
        }.get(error.status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": error.message}}
    else:
        body = {"error": {"message": error.message, "type": error.kind, "param": error.param, "code": None}}
    return JSONResponse(body, status_code=error.status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def create_app(service: ChatService, config: ServerConfig) -> FastAPI:
    app = FastAPI(title="strata", version="0.1.0")

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request, APIError(400, _validation_message(exc)))

    @app.middleware("http")
    async def require_key(request: Request, call_next):  # type: ignore[no-untyped-def]
        if config.api_key is not None and request.url.path not in _OPEN_ROUTES:
            auth = request.headers.get("authorization", "")
            given = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
            given = given or request.headers.get("x-api-key")
            if given is None or not hmac.compare_digest(given.encode(), config.api_key.encode()):
                err = APIError(
                    401,
                    "missing or wrong API key: send Authorization: Bearer KEY or x-api-key",
                    "authentication_error",
                )
                return error_response(request, err)
        return await call_next(request)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app.include_router(OpenAIServing(service, config.model_name).router())
    app.include_router(AnthropicServing(service, config.model_name).router())
    return app
