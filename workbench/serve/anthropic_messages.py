"""Hosted-API prompt caching on the real server: Anthropic's ``POST /v1/messages`` with ``cache_control``, and
an OpenAI chat endpoint that honours ``prompt_cache_key``, both emulating the provider's billing rules
(`workbench.hosted`) over the engine's real prefix cache.

The engine decides what it really skips (its prefix cache works in 16-token blocks, with no minimum and no
TTL); the provider model decides what the provider would *report and bill*. Both are returned: the provider's
``usage`` in the body, the engine's own count in the ``x-workbench-engine-cached-tokens`` header, so a reader
can see where the two differ (under the minimum the engine still reuses the prefix; the bill does not).

    POST /v1/messages                           Anthropic Messages (non-streaming), cache_control + usage
    POST /hosted/openai/v1/chat/completions     OpenAI chat with prompt_cache_key and emulated cached_tokens

Each server keeps one emulated cache per provider model, on the wall clock (``time.monotonic``); the
simulated clock is for the notebook's offline timelines.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from workbench.config import SamplingParams
from workbench.hosted.anthropic_cache import AnthropicCache, Block, CacheUsage
from workbench.hosted.openai_cache import OpenAICache
from workbench.hosted.pricing import models
from workbench.serve.admission import chat_messages, tokenize
from workbench.serve.engine_loop import EngineLoop
from workbench.serve.errors import APIError, from_value_error
from workbench.serve.schemas import ChatCompletionRequest

ENGINE_CACHED_HEADER = "x-workbench-engine-cached-tokens"
STOP_REASONS = {"length": "max_tokens", "stop": "end_turn", "abort": "end_turn"}


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CacheControl(_Loose):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"


class TextBlock(_Loose):
    type: Literal["text"] = "text"
    text: str
    cache_control: CacheControl | None = None


class Message(_Loose):
    role: Literal["user", "assistant"]
    content: str | list[TextBlock]


class Tool(_Loose):
    name: str
    description: str = ""
    input_schema: dict = Field(default_factory=dict)
    cache_control: CacheControl | None = None


class MessagesRequest(_Loose):
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    temperature: float = Field(1.0, ge=0, le=1)
    stream: bool = False


class CachedChatRequest(ChatCompletionRequest):
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] = "in_memory"


def _texts(content: str | list[TextBlock] | None) -> list[TextBlock]:
    if content is None:
        return []
    return [TextBlock(text=content)] if isinstance(content, str) else content


def render_blocks(tokenizer, body: MessagesRequest) -> list[Block]:
    """The prompt as token blocks in Anthropic's cache order (tools → system → messages), in ChatML turns;
    the last block is the assistant's turn header, never a breakpoint."""
    turns: list[tuple[str, list[tuple[str, CacheControl | None]]]] = []
    if body.tools:
        turns.append(("system", [(json.dumps({"name": t.name, "description": t.description,
                                               "input_schema": t.input_schema}), t.cache_control)
                                  for t in body.tools]))
    if body.system:
        turns.append(("system", [(b.text, b.cache_control) for b in _texts(body.system)]))
    turns += [(m.role, [(b.text, b.cache_control) for b in _texts(m.content)]) for m in body.messages]
    blocks = []
    for role, parts in turns:
        for index, (text, control) in enumerate(parts):
            head = f"<|im_start|>{role}\n" if index == 0 else ""
            tail = "<|im_end|>\n" if index == len(parts) - 1 else ""
            ids = tokenizer.encode(head + text + tail, add_special_tokens=False)
            blocks.append(Block(tuple(ids), control.ttl if control else None))
    blocks.append(Block(tuple(tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False))))
    return blocks


def _anthropic_error(status: int, message: str, type_: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": type_, "message": message}}, status_code=status)


async def _generate(loop: EngineLoop, request_id: str, admit, on_start) -> tuple[str, str | None, int, int]:
    """Run one request on the engine: (text, finish reason, output tokens, engine-cached prompt tokens)."""
    stream = await loop.add_request(request_id, admit, 1, loop.engine.clock())
    text, reason, tokens, started = "", None, 0, False
    async for event in stream:
        for delta in event.choices:
            text, tokens = text + delta.text, tokens + delta.num_tokens
            reason = delta.finish_reason or reason
            if delta.num_tokens and not started:
                started = True
                now = time.monotonic()
                loop.call(lambda engine, now=now: on_start(now))  # the cache's owner is the engine thread
        if event.error is not None:
            raise RuntimeError(event.error)
        if event.is_last:
            return text, reason, tokens, event.usage.cached_tokens if event.usage else 0
    return text, reason, tokens, 0


def hosted_router(loop: EngineLoop, *, dependencies: list | None = None) -> APIRouter:
    """The routes above over ``loop``'s engine (emulated caches are created on first use of each model)."""
    router = APIRouter(dependencies=dependencies or [])
    anthropic: dict[str, AnthropicCache] = {}
    openai: dict[str, OpenAICache] = {}

    @router.post("/v1/messages")
    async def messages(body: MessagesRequest) -> JSONResponse:
        if body.stream:
            return _anthropic_error(400, "stream=true is not supported by this emulation; send stream=false")
        if body.model not in models("anthropic"):
            return _anthropic_error(404, f"model {body.model!r} not found; emulated: {models('anthropic')}",
                                    "not_found_error")
        cache = anthropic.setdefault(body.model, AnthropicCache(body.model))
        usage: list[CacheUsage] = []

        def admit(engine):
            blocks = render_blocks(engine.tokenizer, body)
            usage.append(cache.begin(blocks))  # raises ValueError for a fifth breakpoint: a 400, nothing run
            ids = [t for block in blocks for t in block.tokens]
            return ids, SamplingParams(max_tokens=body.max_tokens, temperature=body.temperature)

        request_id = f"msg_{uuid.uuid4().hex[:24]}"
        try:
            text, reason, out_tokens, engine_cached = await _generate(
                loop, request_id, admit, lambda now: cache.mark_started(usage[0], now))
        except ValueError as exc:
            return _anthropic_error(400, str(exc))
        payload = {"id": request_id, "type": "message", "role": "assistant", "model": body.model,
                   "content": [{"type": "text", "text": text}], "stop_reason": STOP_REASONS.get(reason, "end_turn"),
                   "stop_sequence": None, "usage": usage[0].to_dict(out_tokens)}
        return JSONResponse(payload, headers={ENGINE_CACHED_HEADER: str(engine_cached)})

    @router.post("/hosted/openai/v1/chat/completions")
    async def chat(body: CachedChatRequest) -> JSONResponse:
        model = body.model or "gpt-4o"
        if model not in models("openai") or body.stream or body.n != 1:
            raise APIError(400, f"this emulation takes one of {models('openai')}, stream=false and n=1; got "
                             f"model={model!r}, stream={body.stream}, n={body.n}", param="model")
        cache = openai.setdefault(body.prompt_cache_retention, OpenAICache(retention=body.prompt_cache_retention))
        found = []

        def admit(engine):
            ids = tokenize(engine.tokenizer, chat_messages(body.messages))
            found.append(cache.request(ids, body.prompt_cache_key))
            max_tokens = body.requested_max_tokens or 16
            return ids, SamplingParams(max_tokens=max_tokens, temperature=body.temperature or 0.0)

        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        try:
            text, reason, out_tokens, engine_cached = await _generate(loop, request_id, admit, lambda now: None)
        except ValueError as exc:
            raise from_value_error(exc) from exc
        payload = {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                                "finish_reason": reason}], "usage": found[0].to_dict(out_tokens)}
        return JSONResponse(payload, headers={ENGINE_CACHED_HEADER: str(engine_cached)})

    return router
