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
simulated clock is for the notebook's offline timelines. Both routes run through the shared ``Pipeline`` (text
off the engine thread, the context check, an abort when the client leaves); ``/v1/messages`` answers errors in
Anthropic's shape and, under ``--api-key``, also takes the key in Anthropic's ``x-api-key`` header.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from workbench.config import SamplingParams
from workbench.hosted.anthropic_cache import AnthropicCache, Block, CacheUsage
from workbench.hosted.openai_cache import OpenAICache
from workbench.hosted.pricing import models
from workbench.serve.admission import chat_messages, sampling_params, tokenize
from workbench.serve.errors import MESSAGES_PATH, APIError, GuardedRoute
from workbench.serve.pipeline import Collected, Job, Pipeline
from workbench.serve.schemas import ChatCompletionRequest

ENGINE_CACHED_HEADER = "x-workbench-engine-cached-tokens"
STOP_REASONS = {"length": "max_tokens", "stop": "end_turn", "abort": "end_turn"}
# max_tokens of the hosted OpenAI emulation when a request sets none (a short answer: the emulation is about the
# prompt's cache, not the reply).
HOSTED_DEFAULT_MAX_TOKENS = 16


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


async def _whole_reply(pipeline: Pipeline, request: Request, job: Job, on_first_token=None) -> Collected:
    return await pipeline.whole(await pipeline.start(job), request, on_first_token)


def hosted_router(pipeline: Pipeline) -> APIRouter:
    """The routes above over ``pipeline`` (emulated caches are created on first use of each model). Each goes
    through the pipeline like every other route: tokenized off the engine thread, checked against the context,
    aborted when its client leaves."""
    router = APIRouter(route_class=GuardedRoute)
    anthropic: dict[str, AnthropicCache] = {}
    openai: dict[str, OpenAICache] = {}

    @router.post(MESSAGES_PATH)
    async def messages(body: MessagesRequest, request: Request) -> JSONResponse:
        if body.stream:
            raise APIError(400, "stream=true is not supported by this emulation; send stream=false", param="stream")
        if body.model not in models("anthropic"):
            raise APIError(404, f"model {body.model!r} not found; emulated: {models('anthropic')}", param="model")
        cache = anthropic.setdefault(body.model, AnthropicCache(body.model))
        rendered: list[list[Block]] = []  # on a text worker
        usage: list[CacheUsage] = []  # on the engine thread, the emulated cache's owner

        def render(tokenizer) -> list[int]:
            rendered.append(render_blocks(tokenizer, body))
            return [t for block in rendered[0] for t in block.tokens]

        def begin(engine, ids: list[int]) -> None:
            usage.append(cache.begin(rendered[0]))  # raises ValueError for a fifth breakpoint: a 400, nothing run

        def first_token() -> None:
            now = time.monotonic()
            pipeline.loop.call(lambda engine: cache.mark_started(usage[0], now))

        request_id = f"msg_{uuid.uuid4().hex[:24]}"
        params = SamplingParams(max_tokens=body.max_tokens, temperature=body.temperature)
        got = await _whole_reply(pipeline, request, Job(request_id, render, params, "messages",
                                                        on_admit=begin), first_token)
        payload = {"id": request_id, "type": "message", "role": "assistant", "model": body.model,
                   "content": [{"type": "text", "text": got.texts[0]}],
                   "stop_reason": STOP_REASONS.get(got.reasons[0], "end_turn"), "stop_sequence": None,
                   "usage": usage[0].to_dict(got.usage.completion_tokens)}
        return JSONResponse(payload, headers={ENGINE_CACHED_HEADER: str(got.usage.cached_tokens)})

    @router.post("/hosted/openai/v1/chat/completions")
    async def chat(body: CachedChatRequest, request: Request) -> JSONResponse:
        model = body.model or "gpt-4o"
        if model not in models("openai") or body.stream or body.n != 1:
            raise APIError(400, f"this emulation takes one of {models('openai')}, stream=false and n=1; got "
                                f"model={model!r}, stream={body.stream}, n={body.n}", param="model")
        asked = {"logprobs": body.logprobs, "prompt_logprobs": body.prompt_logprobs is not None,
                 "return_prompt_text": body.return_prompt_text}
        for name, wanted in asked.items():
            if wanted:
                raise APIError(400, f"{name} is not part of this emulation's reply; use /v1/chat/completions",
                               param=name)
        cache = openai.setdefault(body.prompt_cache_retention, OpenAICache(retention=body.prompt_cache_retention))
        found = []
        requested = body.requested_max_tokens or HOSTED_DEFAULT_MAX_TOKENS
        params = sampling_params(body, requested, 1, default_temperature=0.0)
        messages = chat_messages(body.messages)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        template, special = body.template_options(), body.add_special_tokens
        job = Job(request_id, lambda tokenizer: tokenize(tokenizer, messages, template=template,
                                                         add_special_tokens=special, field="messages"),
                  params, "messages",
                  on_admit=lambda engine, ids: found.append(cache.request(ids, body.prompt_cache_key)))
        got = await _whole_reply(pipeline, request, job)
        payload = {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": got.texts[0]},
                                "logprobs": None, "finish_reason": got.reasons[0]}],
                   "usage": found[0].to_dict(got.usage.completion_tokens)}
        return JSONResponse(payload, headers={ENGINE_CACHED_HEADER: str(got.usage.cached_tokens)})

    return router
