"""What stands in front of the endpoints: the request-size limit and the API key.

The size limit is a plain ASGI middleware, so an oversized body is refused with 413 before any of it is
parsed: at once when ``Content-Length`` says so, otherwise as soon as the bytes read pass the limit (a
chunked upload without a length). The key check compares in constant time (``hmac.compare_digest``), so a
caller cannot learn the key a character at a time from response timings.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workbench.serve.errors import APIError, error_body

# Longest prompt SmolLM2 takes (8192 tokens) is ~40 KB of text; 4 MiB leaves room for any chat history
# the context can hold, with JSON escaping, while refusing uploads meant to exhaust memory.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


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
            await self._refuse(int(declared), send)
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
                await self._refuse(size, send)
                return
            body.append(message.get("body", b""))
            more = message.get("more_body", False)
        await self.app(scope, _replay(b"".join(body), rest, receive), send)

    async def _refuse(self, size: int, send: Send) -> None:
        payload = json.dumps(error_body(f"request body of {size} bytes is larger than the limit of "
                                        f"{self.max_bytes} bytes", code="request_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode()), (b"connection", b"close")]})
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


def check_api_key(authorization: str | None, api_key: str) -> None:
    """Raise a 401 unless ``authorization`` is ``Bearer <api_key>``."""
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
        message = ("missing API key: send the header 'Authorization: Bearer <key>'" if not authorization
                   else "invalid API key")
        raise APIError(401, message, code="invalid_api_key")


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A warning when the server would listen beyond this machine without a key, else None."""
    if api_key or host in LOOPBACK_HOSTS:
        return None
    return (f"warning: serving on {host} without an API key: anyone who can reach this machine can use the "
            "model. Pass --api-key (or set WORKBENCH_API_KEY), or bind 127.0.0.1.")
