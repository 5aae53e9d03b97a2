"""Every failure the server reports, in the error shape of the API the route belongs to.

Clients written for OpenAI (and for vLLM, which copies it) read ``{"error": {"message", "type", "param",
"code"}}``; the official ``openai`` client turns the status into its exception class and shows the message.
Anthropic's clients read ``{"type": "error", "error": {"type", "message"}}``, so ``/v1/messages`` answers in that
shape (``error_payload`` picks by path, for the middlewares too). Every error path ends here: our own
``APIError``, the engine's ``ValueError`` (its messages already name the bad value and the allowed range),
FastAPI's validation errors (400 with the field and the range it declares, not FastAPI's 422), malformed JSON,
unknown routes, a client that left (``ClientGone``: nobody reads the answer) and anything unexpected (500, and the
server keeps serving).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from workbench.prompts import ContextLengthError
from workbench.serve.schemas import allowed_range
from workbench.serve.vllm_fields import FieldRefused

log = logging.getLogger("workbench.serve")

# OpenAI's ``type`` for a request the caller must change, and for a fault on our side.
INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

# The route that speaks Anthropic's API, and Anthropic's error type for each status.
MESSAGES_PATH = "/v1/messages"
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
                   429: "rate_limit_error", 503: "overloaded_error"}

# Fields whose name leads a SamplingParams/engine message ("max_tokens must be ..."), so ``param`` can
# point at them without a second copy of the range checks.
_PARAM_NAMES = ("max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop", "stop_token_ids",
                "num_speculative_tokens", "prompt", "messages", "min_p", "min_tokens", "repetition_penalty",
                "frequency_penalty", "presence_penalty", "logprobs")

# Pydantic's error types for a number outside a Field's bounds.
_RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")

# The status of a reply nobody reads (nginx's "client closed request").
CLIENT_CLOSED = 499


class APIError(Exception):
    """An error with an HTTP status that the handlers turn into the route's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type_: str = INVALID_REQUEST):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_


class ClientGone(Exception):
    """The client disconnected before its whole reply was ready; its request has been aborted."""


# Exceptions that have a handler of their own below.
_HANDLED = (APIError, FieldRefused, ClientGone, ValueError, RequestValidationError, StarletteHTTPException)


def error_body(message: str, type_: str = INVALID_REQUEST, param: str | None = None,
               code: str | int | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_payload(path: str, status: int, message: str, type_: str = INVALID_REQUEST, param: str | None = None,
                  code: str | int | None = None) -> dict:
    """The error body for a route at ``path``: Anthropic's shape on /v1/messages, OpenAI's everywhere else."""
    if path == MESSAGES_PATH:
        kind = ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    return error_body(message, type_, param, code)


def error_response(request: Request, status: int, message: str, *, param: str | None = None,
                   code: str | None = None, type_: str = INVALID_REQUEST,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = error_payload(request.url.path, status, message, type_, param, code)
    return JSONResponse(body, status_code=status, headers=headers)


def from_value_error(exc: ValueError, prompt_field: str = "prompt") -> APIError:
    """A 400 for a bad value the engine or SamplingParams refused; ``param`` is the field its message names. A
    prompt past the context (`workbench.prompts.ContextLengthError`) is vLLM's ``context_length_exceeded``, naming
    the request's ``prompt_field`` (``prompt`` or ``messages``)."""
    if isinstance(exc, ContextLengthError):
        exc = exc.for_field(prompt_field)
        return APIError(400, str(exc), param=exc.param, code="context_length_exceeded")
    message = str(exc)
    param = next((name for name in _PARAM_NAMES if message.startswith(name + " ")), None)
    return APIError(400, message, param=param)


def _body_model(request: Request) -> type[BaseModel] | None:
    """The pydantic model of the route's request body (its declared ranges go into the messages)."""
    field = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(getattr(field, "field_info", None), "annotation", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _validation_message(exc: RequestValidationError, model: type[BaseModel] | None) -> tuple[str, str | None]:
    """One readable sentence for the most telling problem FastAPI found, and the field it concerns."""
    errors = exc.errors()
    if not errors:
        return "the request body is not valid", None
    # For a union field each member reports; a member of another type ("should be a valid list") is noise.
    errors = [e for e in errors if not e.get("type", "").endswith("_type")] or errors
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON: {detail}".rstrip(": "), None
    location = [str(part) for part in first.get("loc", ()) if part != "body" and not _is_union_tag(part)]
    field = ".".join(location) or "body"
    given = first.get("input")
    shown = _shown(given)
    extra = f" ({len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    param = location[0] if location else None
    kind, ctx = first.get("type"), first.get("ctx") or {}
    allowed = allowed_range(field, model) if kind in _RANGE_ERRORS else None
    if allowed is not None:
        return f"{field} must be {'in ' if allowed[0] in '[(' else ''}{allowed}, got {shown}{extra}", param
    if kind in ("too_short", "string_too_short") and ctx.get("min_length") == 1:
        return f"{field} must be non-empty, got {shown}{extra}", param
    if kind == "string_pattern_mismatch":
        return f"{field} must hold more than whitespace, got {shown}{extra}", param
    if kind == "too_long":
        return f"{field} takes at most {ctx.get('max_length')} items, got {ctx.get('actual_length')}{extra}", param
    return f"{field}: {first.get('msg', 'invalid value')}, got {shown}{extra}", param


def _shown(value: object) -> str:
    """A value as the client sent it (JSON, cut to 80 characters), or its type for large containers."""
    if isinstance(value, str | int | float | bool | None) or (isinstance(value, list | dict) and len(value) <= 4):
        try:
            return json.dumps(value)[:80]
        except (TypeError, ValueError):
            pass
    return type(value).__name__


def _is_union_tag(part: object) -> bool:
    """A location part naming a union member ("str", "list[int]", "constrained-str"), not a field."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part or "-" in part)


class GuardedRoute(APIRoute):
    """A route whose unexpected exceptions become a 500 inside the app. What reaches Starlette's last-resort handler
    is answered but then re-raised, and uvicorn drops the keep-alive connection with it; here the client gets its
    500 and keeps its connection."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except _HANDLED:
                raise
            except Exception as exc:
                log.exception("unhandled error in %s %s", request.method, request.url.path)
                raise APIError(500, f"internal error: {type(exc).__name__}: {exc}", type_=SERVER_ERROR) from exc

        return guarded


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(request, exc.status, exc.message, param=exc.param, code=exc.code, type_=exc.type)

    @app.exception_handler(FieldRefused)
    async def _refused(request: Request, exc: FieldRefused) -> JSONResponse:
        return error_response(request, 400, exc.message, param=exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc, _body_model(request))
        return error_response(request, 400, message, param=param)

    @app.exception_handler(ValueError)
    async def _value_error(request: Request, exc: ValueError) -> JSONResponse:
        error = from_value_error(exc)
        return error_response(request, error.status, error.message, param=error.param)

    @app.exception_handler(ClientGone)
    async def _client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        return error_response(request, exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return error_response(request, 500, f"internal error: {type(exc).__name__}: {exc}", type_=SERVER_ERROR)
