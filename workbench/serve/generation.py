"""One completion request from HTTP to the engine and back, streaming or whole.

The handler checks what it can without the engine (model name, options), then hands an *admission* closure to
the engine thread, which tokenizes, checks the context and adds the request, or raises to refuse it: the 400
comes back before any response has started. A streaming reply is a ``StreamingResponse`` of server-sent
events; when the client goes away (Starlette notices the disconnect and stops the response), the request is
aborted at once so its KV blocks go back to the pool. A whole reply watches for the same disconnect while it
waits.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from workbench.engine.llm_engine import LLMEngine
from workbench.serve.admission import chat_messages, fit_to_context, prompt_of, sampling_params, tokenize
from workbench.serve.engine_loop import EngineLoop, EngineStopped
from workbench.serve.errors import SERVER_ERROR, APIError, from_value_error
from workbench.serve.responses import Responder
from workbench.serve.schemas import ChatCompletionRequest, CompletionRequest, TokenizeRequest
from workbench.serve.streams import RequestStream

T = TypeVar("T")


class AbortOnClose(StreamingResponse):
    """A streaming response that runs ``on_close`` however it ends: finished, failed or client gone."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class Generator:
    def __init__(self, loop: EngineLoop, model_name: str, max_context: int):
        self.loop, self.model_name, self.max_context = loop, model_name, max_context
        self.created = int(time.time())

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    async def tokenize(self, body: TokenizeRequest) -> list[int]:
        prompt = chat_messages(body.messages) if body.messages is not None else body.prompt
        return await _mapped(self.loop.run(lambda engine: tokenize(
            engine.tokenizer, prompt, add_generation_prompt=body.add_generation_prompt)))

    async def detokenize(self, tokens: list[int]) -> str:
        def decode(engine: LLMEngine) -> str:
            vocab = engine.model.spec.vocab_size
            bad = [t for t in tokens if not 0 <= t < vocab]
            if bad:
                raise APIError(400, f"token ids must be in [0, {vocab}), got {bad[:5]}", param="tokens")
            return engine.tokenizer.decode(tokens)

        return await _mapped(self.loop.run(decode))

    async def respond(self, body: CompletionRequest | ChatCompletionRequest, request: Request, *,
                      chat: bool) -> Response:
        self.check_model(body.model)
        requested = body.requested_max_tokens if chat else body.max_tokens
        params = sampling_params(body, requested, self.loop.engine.scheduler_config.max_num_seqs)
        prompt, prompt_field = prompt_of(body)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        arrival = self.loop.engine.clock()
        max_context = self.max_context

        def admit(engine: LLMEngine):
            ids = tokenize(engine.tokenizer, prompt)
            pool_tokens = engine.blocks.num_blocks * engine.cache_config.block_size
            return ids, fit_to_context(params, requested, len(ids), max_context, pool_tokens, prompt_field)

        stream = await _mapped(self.loop.add_request(request_id, admit, params.n, arrival))
        responder = Responder(request_id, self.model_name, chat=chat, n=params.n, include_usage=body.include_usage,
                              continuous_usage=body.continuous_usage, num_prompt_tokens=stream.num_prompt_tokens)
        if body.stream:
            return AbortOnClose(self._events(stream, responder), lambda: self._abort_unless_done(stream))
        return await self._whole(stream, responder, request)

    def _abort_unless_done(self, stream: RequestStream) -> None:
        if not stream.finished:
            self.loop.abort(stream.request_id)

    async def _events(self, stream: RequestStream, responder: Responder) -> AsyncIterator[str]:
        async for event in stream:
            for line in responder.events(event):
                yield line

    async def _whole(self, stream: RequestStream, responder: Responder, request: Request) -> Response:
        texts, reasons = [""] * responder.n, [None] * responder.n
        logprobs: list[list | None] = [None] * responder.n

        async def collect():
            async for event in stream:
                for delta in event.choices:
                    texts[delta.index] += delta.text
                    reasons[delta.index] = delta.finish_reason or reasons[delta.index]
                    if delta.logprobs is not None:
                        logprobs[delta.index] = (logprobs[delta.index] or []) + delta.logprobs
                if event.is_last:
                    return event

        collecting = asyncio.ensure_future(collect())
        watching = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait({collecting, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
            if not collecting.done():
                collecting.cancel()
                self.loop.abort(stream.request_id)
        if not collecting.done() or collecting.cancelled():
            return Response(status_code=499)  # the client is gone; nobody reads this
        last = collecting.result()
        if last.error is not None:
            raise APIError(500, last.error, type_=SERVER_ERROR)
        return JSONResponse(responder.full(texts, reasons, last.usage, logprobs))


async def _mapped(awaitable: Awaitable[T]) -> T:
    """Await an engine-thread call, mapping refusals to HTTP errors (400 for bad input, 503 when stopping)."""
    try:
        return await awaitable
    except APIError:
        raise
    except EngineStopped as exc:
        raise APIError(503, str(exc), code="service_unavailable", type_=SERVER_ERROR) from exc
    except ValueError as exc:
        raise from_value_error(exc) from exc


async def _client_gone(request: Request) -> None:
    """Return when the client disconnects (the body is already read, so the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
