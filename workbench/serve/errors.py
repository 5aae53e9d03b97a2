"""Every failure the server reports, in OpenAI's error shape.

Clients written for OpenAI (and for vLLM, which copies it) read ``{"error": {"message", "type", "param",
"code"}}``; the official ``openai`` client turns the status into its exception class and shows the message.
So every error path ends here: our own ``APIError``, the engine's ``ValueError`` (its messages already name
the bad value and the allowed range), FastAPI's validation errors (which would otherwise be 422 with a
different shape), malformed JSON, unknown routes and anything unexpected (500, and the server keeps serving).
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from workbench.serve.schemas import allowed_range

log = logging.getLogger("workbench.serve")

# OpenAI's ``type`` for a request the caller must change, and for a fault on our side.
INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

# Fields whose name leads a SamplingParams/engine message ("max_tokens must be ..."), so ``param`` can
# point at them without a second copy of the range checks.
_PARAM_NAMES = ("max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop", "stop_token_ids",
                "num_speculative_tokens", "prompt", "messages", "min_p", "min_tokens", "repetition_penalty",
                "frequency_penalty", "presence_penalty", "logprobs")


# Pydantic's error types for a number outside a Field's bounds.
_RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


class APIError(Exception):
    """An error with an HTTP status that the handlers turn into OpenAI's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type_: str = INVALID_REQUEST):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str = INVALID_REQUEST, param: str | None = None,
               code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, *, param: str | None = None, code: str | None = None,
                   type_: str = INVALID_REQUEST, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


def from_value_error(exc: ValueError) -> APIError:
    """A 400 for a bad value the engine or SamplingParams refused; ``param`` is the field its message names."""
    message = str(exc)
    param = next((name for name in _PARAM_NAMES if message.startswith(name + " ")), None)
    return APIError(400, message, param=param)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One readable sentence for the first problem FastAPI found, and the field it concerns."""
    errors = exc.errors()
    if not errors:
        return "the request body is not valid", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON: {detail}".rstrip(": "), None
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    field = ".".join(location) or "body"
    given = first.get("input")
    shown = json.dumps(given)[:80] if isinstance(given, str | int | float | bool | None) else type(given).__name__
    extra = f" ({len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    param = location[0] if location else None
    allowed = allowed_range(field) if first.get("type") in _RANGE_ERRORS else None
    if allowed is not None:
        return f"{field} must be {'in ' if allowed[0] in '[(' else ''}{allowed}, got {shown}{extra}", param
    return f"{field}: {first.get('msg', 'invalid value')}, got {shown}{extra}", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(400, message, param=param)

    @app.exception_handler(ValueError)
    async def _value_error(request: Request, exc: ValueError) -> JSONResponse:
        error = from_value_error(exc)
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", type_=SERVER_ERROR)
