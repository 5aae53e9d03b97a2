"""The one path every generation route takes, from a described job to a finished (or abandoned) request.

A route (OpenAI completions and chat, Anthropic messages, the hosted OpenAI emulation, any route added later)
only says what to generate (a ``Job``) and how to render the result; ``Pipeline`` does the rest the same way for
all of them, so no route can forget a step:

1. tokenize on a text worker, never on the engine thread (`workbench.serve.text_workers`), and check given token
   ids against the vocabulary;
2. check prompt + max_tokens against the context and the KV pool with the engine's own policy
   (`workbench.engine.requests.resolved_max_tokens`, which the engine runs again as it admits): a 400 before the
   engine thread sees anything, worded as the engine words it;
3. admit on the engine thread (``job.on_admit`` runs there first, for state the engine thread owns), mapping
   refusals to HTTP errors: 400 for bad input, 503 while the server drains;
4. follow the request to its end, and abort it the moment its client goes away: a streaming response aborts when
   Starlette stops it (``AbortOnClose``), a whole reply races the engine against the client's ``http.disconnect``
   (what vLLM's ``with_cancellation`` does), so a gone client never leaves a generation running for nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from workbench.config import SamplingParams
from workbench.engine.llm_engine import LLMEngine
from workbench.engine.requests import resolved_max_tokens
from workbench.serve.admission import check_vocabulary
from workbench.serve.batch import MergedStream
from workbench.serve.engine_loop import EngineLoop, EngineStopped
from workbench.serve.errors import SERVER_ERROR, APIError, ClientGone, from_value_error
from workbench.serve.streams import LogprobEntry, RequestStream, StreamEvent, Usage
from workbench.serve.text_workers import TextWorkers

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Job:
    """One generation request as a route describes it."""

    request_id: str
    tokenize: Callable[[Any], list[int]]  # the prompt's token ids, given a tokenizer (runs on a text worker)
    params: SamplingParams  # max_tokens as the client sent it (None: what the context and the KV pool leave)
    prompt_field: str  # the request field the prompt came from, named in errors
    on_admit: Callable[[LLMEngine, list[int]], None] | None = None  # on the engine thread, before the engine adds it


@dataclass(slots=True)
class Collected:
    """A whole reply: each choice's text, finish reason and log-probabilities, and the request's usage."""

    texts: list[str]
    reasons: list[str | None]
    logprobs: list[list[LogprobEntry] | None]
    usage: Usage = field(default_factory=lambda: Usage(0, 0, 0))
    prompt_logprobs: list[list[LogprobEntry] | None] = field(default_factory=list)  # per choice, when asked for
    stop_reasons: list[str | int | None] = field(default_factory=list)


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


class Pipeline:
    def __init__(self, loop: EngineLoop, workers: TextWorkers):
        self.loop, self.workers = loop, workers
        engine = loop.engine
        self.max_context = engine.model.spec.max_context
        self.vocab_size = engine.model.spec.vocab_size

    async def start(self, job: Job) -> RequestStream:
        """Tokenize, check the context and admit ``job``; its stream of events (APIError if refused)."""
        arrival = self.loop.engine.clock()  # the request's clock starts before its tokenization
        ids = await self.workers.run(lambda tokenizer: self._token_ids(job, tokenizer))
        try:
            resolved_max_tokens(len(ids), job.params, self.loop.engine.limits)  # read-only: the engine's limits
        except ValueError as exc:
            raise from_value_error(exc, job.prompt_field) from exc

        def admit(engine: LLMEngine) -> tuple[list[int], SamplingParams]:
            if job.on_admit is not None:
                job.on_admit(engine, ids)
            return ids, job.params

        return await mapped(self.loop.add_request(job.request_id, admit, job.params.n, arrival), job.prompt_field)

    def _token_ids(self, job: Job, tokenizer: Any) -> list[int]:
        ids = job.tokenize(tokenizer)
        check_vocabulary(ids, self.vocab_size, job.prompt_field)
        return ids

    def streaming(self, stream: RequestStream, render: Callable[[StreamEvent], list[str]]) -> AbortOnClose:
        """A server-sent-events response of ``render(event)`` lines; the request is aborted if it ends early."""

        async def lines() -> AsyncIterator[str]:
            async for event in stream:
                for line in render(event):
                    yield line

        return AbortOnClose(lines(), lambda: self._abort_unless_done(stream))

    async def whole(self, stream: RequestStream, request: Request,
                    on_first_token: Callable[[], None] | None = None) -> Collected:
        """Every event of ``stream`` gathered; ``ClientGone`` (request aborted) if the client leaves first, a 500
        if the engine failed the request. ``on_first_token`` runs when the first token arrives."""
        n = stream.num_choices
        collected = Collected([""] * n, [None] * n, [None] * n, prompt_logprobs=[None] * n, stop_reasons=[None] * n)
        collecting = asyncio.ensure_future(self._collect(stream, collected, on_first_token))
        watching = asyncio.ensure_future(client_gone(request))
        try:
            await asyncio.wait({collecting, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
            if not collecting.done():
                collecting.cancel()
                self._abort_unless_done(stream)
        if not collecting.done() or collecting.cancelled():
            raise ClientGone(stream.request_id)
        last = collecting.result()
        if last.error is not None:
            self._abort_unless_done(stream)  # a batch's other prompts
            raise APIError(500, last.error, type_=SERVER_ERROR)
        collected.usage = last.usage or collected.usage
        return collected

    @staticmethod
    async def _collect(stream: RequestStream, into: Collected, on_first_token: Callable[[], None] | None
                       ) -> StreamEvent:
        started = False
        async for event in stream:
            for delta in event.choices:
                into.texts[delta.index] += delta.text
                into.reasons[delta.index] = delta.finish_reason or into.reasons[delta.index]
                if delta.logprobs is not None:
                    into.logprobs[delta.index] = (into.logprobs[delta.index] or []) + delta.logprobs
                if delta.prompt_logprobs is not None:
                    into.prompt_logprobs[delta.index] = delta.prompt_logprobs
                if delta.stop_reason is not None:
                    into.stop_reasons[delta.index] = delta.stop_reason
                if delta.num_tokens and not started and on_first_token is not None:
                    started = True
                    on_first_token()
            if event.is_last:
                return event
        raise RuntimeError(f"the stream of {stream.request_id} ended without its last event")

    def _abort_unless_done(self, stream: RequestStream) -> None:
        for request_id in stream.open_request_ids():
            self.loop.abort(request_id)

    async def start_all(self, jobs: list[Job]) -> RequestStream:
        """``start`` each job (the prompts of one request), one stream of all their events; if one is refused,
        the ones admitted before it are aborted and its error raised."""
        streams: list[RequestStream] = []
        try:
            for job in jobs:
                streams.append(await self.start(job))
        except BaseException:
            for stream in streams:
                self._abort_unless_done(stream)
            raise
        return streams[0] if len(streams) == 1 else MergedStream(streams)


async def mapped(awaitable: Awaitable[T], prompt_field: str = "prompt") -> T:
    """Await an engine-thread call, mapping refusals to HTTP errors (400 for bad input, 503 when stopping)."""
    try:
        return await awaitable
    except APIError:
        raise
    except EngineStopped as exc:
        raise APIError(503, str(exc), code="service_unavailable", type_=SERVER_ERROR) from exc
    except ValueError as exc:
        raise from_value_error(exc, prompt_field) from exc


async def client_gone(request: Request) -> None:
    """Return when the client disconnects (the body is already read, so the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
