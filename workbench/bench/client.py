"""Sending one request to an OpenAI-compatible server and timing what comes back, as a client sees it.

Times are ``time.perf_counter()`` seconds relative to the benchmark's start. With streaming, each
server-sent event that carries text is one *chunk*: TTFT is the first chunk's arrival after the request was
sent, and the gaps between chunks are the inter-token latencies a reader feels (a chunk may hold more than one
token, e.g. with speculative decoding; the token count comes from the usage the server reports at the end).
Failures never raise: they become a record with ``success=False`` and the server's message.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx
from httpx_sse import aconnect_sse


@dataclass(slots=True)
class RequestRecord:
    index: int
    endpoint: str
    start_s: float  # when it was sent, relative to the benchmark's start
    success: bool = False
    status: int | None = None
    error: str | None = None
    request_id: str | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk with text
    end_s: float | None = None
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None

    @property
    def usage_reported(self) -> bool:
        return self.output_tokens is not None


def _choice_text(payload: dict, endpoint: str) -> tuple[str, str | None]:
    choices = payload.get("choices") or []
    if not choices:
        return "", None
    choice = choices[0]
    if endpoint == "chat":
        part = choice.get("delta") or choice.get("message") or {}
        text = part.get("content") or ""
    else:
        text = choice.get("text") or ""
    return text, choice.get("finish_reason")


def _take_usage(record: RequestRecord, usage: dict | None) -> None:
    if not usage:
        return
    record.prompt_tokens = usage.get("prompt_tokens")
    record.output_tokens = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details") or {}
    record.cached_tokens = details.get("cached_tokens")


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
        message = response.text[:500]
    return f"HTTP {response.status_code}: {message}"


async def send_request(client: httpx.AsyncClient, url: str, body: dict, record: RequestRecord, t0: float,
                       headers: dict[str, str] | None = None) -> RequestRecord:
    """Send ``body`` to ``url`` and fill ``record`` with what was measured."""
    try:
        if body.get("stream"):
            await _streamed(client, url, body, record, t0, headers)
        else:
            await _whole(client, url, body, record, t0, headers)
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, TypeError) as exc:
        record.error = record.error or f"{type(exc).__name__}: {exc}"
        record.success = False
    record.end_s = time.perf_counter() - t0
    return record


async def _streamed(client, url, body, record: RequestRecord, t0: float, headers) -> None:
    async with aconnect_sse(client, "POST", url, json=body, headers=headers) as source:
        response = source.response
        record.status = response.status_code
        if response.status_code != 200:
            await response.aread()
            record.error = _error_message(response)
            return
        done = False
        async for event in source.aiter_sse():
            if event.data == "[DONE]":
                done = True
                break
            payload = json.loads(event.data)
            if "error" in payload:
                record.error = str(payload["error"].get("message", payload["error"]))
                return
            record.request_id = record.request_id or payload.get("id")
            text, reason = _choice_text(payload, record.endpoint)
            if text:
                record.chunk_times.append(time.perf_counter() - t0)
                record.text += text
            record.finish_reason = reason or record.finish_reason
            _take_usage(record, payload.get("usage"))
        record.success = done
        if not done:
            record.error = "the stream ended without [DONE]"


async def _whole(client, url, body, record: RequestRecord, t0: float, headers) -> None:
    response = await client.post(url, json=body, headers=headers)
    record.status = response.status_code
    if response.status_code != 200:
        record.error = _error_message(response)
        return
    payload = response.json()
    record.request_id = payload.get("id")
    record.text, record.finish_reason = _choice_text(payload, record.endpoint)
    record.chunk_times.append(time.perf_counter() - t0)
    _take_usage(record, payload.get("usage"))
    record.success = True
