"""What stands in front of the endpoints: the request-size limit, the API key, and the body's media type and text.

The size limit and the key check are plain ASGI middlewares, so they answer before any of the body is parsed: a
body over the limit gets 413 at once when ``Content-Length`` says so, otherwise as soon as the bytes read pass the
limit (a chunked upload without a length); a guarded path without the right key gets 401 first, whatever its body
or route (vLLM's ``AuthenticationMiddleware`` order). The key check compares in constant time
(``hmac.compare_digest``), so a caller cannot learn the key a character at a time from response timings.

``json_body_edge`` runs before every route's body is validated, once, for all routes: a body that is not
``application/json`` gets 415 naming the header, and text that is not valid Unicode (a lone UTF-16 surrogate,
``"\\ud800"``, is valid JSON but no character) gets 400 naming the field, before any tokenizer sees it.
"""

from __future__ import annotations

import hmac
import json

from fastapi import Request
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workbench.serve.errors import MESSAGES_PATH, APIError, error_payload

# Longest prompt SmolLM2 takes (8192 tokens) is ~40 KB of text; 4 MiB leaves room for any chat history
# the context can hold, with JSON escaping, while refusing uploads meant to exhaust memory.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

# The paths that need the key under --api-key. vLLM guards the paths that start with /v1 (its
# AuthenticationMiddleware); /tokenize, /detokenize, /health, /metrics, /version and /openapi.json stay open there,
# and here. The hosted emulations are guarded too.
GUARDED_PREFIXES = ("/v1", "/hosted")

# Methods whose request bodies the edge checks.
_BODY_METHODS = ("POST", "PUT", "PATCH")


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES):
        if not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be an integer >= 1, got {max_bytes!r}")
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, int(declared), send)
            return
        body, more, rest = [], True, None
        size = 0
        while more:  # read the whole body first: requests here are small, and a refusal must come before parsing
            message = await receive()
            if message["type"] != "http.request":
                rest = message
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(scope, size, send)
                return
            body.append(message.get("body", b""))
            more = message.get("more_body", False)
        await self.app(scope, _replay(b"".join(body), rest, receive), send)

    async def _refuse(self, scope: Scope, size: int, send: Send) -> None:
        message = f"request body of {size} bytes is larger than the limit of {self.max_bytes} bytes"
        await send_error(scope, send, 413, message, code="request_too_large", close=True)


async def send_error(scope: Scope, send: Send, status: int, message: str, *, code: str, close: bool = False) -> None:
    """An error response sent by a middleware, in the error shape of the path's API."""
    payload = json.dumps(error_payload(scope["path"], status, message, code=code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status,
                "headers": headers + ([(b"connection", b"close")] if close else [])})
    await send({"type": "http.response.body", "body": payload})


def _replay(body: bytes, pending: Message | None, receive: Receive) -> Receive:
    """A receive() that hands out the buffered body once, then the real channel (for disconnects)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent, pending
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if pending is not None:
            message, pending = pending, None
            return message
        return await receive()

    return replayed


class ApiKeyGuard:
    """401 on the guarded paths unless the request carries ``Authorization: Bearer <key>`` (on /v1/messages,
    Anthropic's ``x-api-key: <key>`` too, the header its SDKs send)."""

    def __init__(self, app: ASGIApp, api_key: str):
        if not api_key:
            raise ValueError("api_key must be a non-empty string")
        self.app, self.api_key = app, api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or not scope["path"].startswith(GUARDED_PREFIXES):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        anthropic = scope["path"] == MESSAGES_PATH
        problem = api_key_problem(headers.get("authorization"), headers.get("x-api-key") if anthropic else None,
                                  self.api_key, anthropic=anthropic)
        if problem is None:
            await self.app(scope, receive, send)
        else:
            await send_error(scope, send, 401, problem, code="invalid_api_key")


def api_key_problem(authorization: str | None, x_api_key: str | None, api_key: str, *,
                    anthropic: bool = False) -> str | None:
    """Why the headers do not carry ``api_key`` (``Bearer <key>``, or ``x_api_key`` on Anthropic's route), or None."""
    expected = api_key.encode()
    if x_api_key is not None and hmac.compare_digest(x_api_key.strip().encode(), expected):
        return None
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected):
        return None
    if not authorization and x_api_key is None:
        return "missing API key: send the header " + ("'x-api-key: <key>' or " if anthropic else "") + \
            "'Authorization: Bearer <key>'"
    return "invalid API key"


async def json_body_edge(request: Request) -> None:
    """Before a route's body is validated: 415 unless it is JSON, 400 naming the field if any text in it (values or
    keys, at any depth) is not valid Unicode."""
    if request.method not in _BODY_METHODS:
        return
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        got = f"Content-Type {media!r}" if media else "no Content-Type"
        raise APIError(415, f"the request body must be JSON with 'Content-Type: application/json'; got {got}",
                       code="unsupported_media_type")
    try:
        body = await request.json()  # parsed once: FastAPI's own parse of this request, cached by Starlette
    except ValueError:
        return  # not JSON: FastAPI's validation says so
    problem = first_invalid_text(body)
    if problem is not None:
        path, message = problem
        raise APIError(400, f"{path or 'body'} {message}", param=path.split(".")[0].split("[")[0] or None)


def first_invalid_text(value: object) -> tuple[str, str] | None:
    """(JSON path, what is wrong) for the first string in ``value`` that is not valid Unicode text, or None.

    Walks iteratively, so a deeply nested body cannot exhaust the stack."""
    pending: list[tuple[str, object]] = [("", value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            problem = _invalid_text(item)
            if problem:
                return path, problem
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                key_problem = _invalid_text(key)
                if key_problem:
                    return f"{path}.{key!r}".lstrip("."), f"(a key) {key_problem}"
                pending.append((f"{path}.{key}".lstrip("."), child))
        elif isinstance(item, list):
            pending.extend((f"{path}[{index}]", child) for index, child in reversed(list(enumerate(item))))
    return None


def _invalid_text(text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"is not valid Unicode text: it holds a lone UTF-16 surrogate U+{ord(text[exc.start]):04X} at "
                f"character {exc.start} (write characters beyond U+FFFF as a surrogate pair, or send UTF-8)")
    return None


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A warning when the server would listen beyond this machine without a key, else None."""
    if api_key or host in LOOPBACK_HOSTS:
        return None
    return (f"warning: serving on {host} without an API key: anyone who can reach this machine can use the "
            "model. Pass --api-key (or set WORKBENCH_API_KEY), or bind 127.0.0.1.")
