"""A completions request with several prompts (OpenAI's and vLLM's ``prompt: [...]``) as one stream of events.

Each prompt is a request of its own in the engine (they are batched there like any others); ``MergedStream``
hands their events to the route as one ``RequestStream`` would, with each choice renumbered ``prompt_index * n +
i`` as OpenAI and vLLM number them. Its last event comes when every prompt has ended, with their usage summed, or
at the first engine error (the route then aborts the prompts still running: ``open_request_ids``).
"""

from __future__ import annotations

import asyncio

from workbench.serve.streams import RequestStream, StreamEvent, Usage


class MergedStream:
    def __init__(self, streams: list[RequestStream]):
        self.streams = streams
        self.n = streams[0].num_choices
        self.num_choices = self.n * len(streams)
        self.request_id = streams[0].request_id
        self.num_prompt_tokens = sum(s.num_prompt_tokens for s in streams)
        self.finished = False
        self._queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self._usage = Usage(0, 0, 0)
        self._open = len(streams)
        self._pumps = [asyncio.ensure_future(self._pump(i, s)) for i, s in enumerate(streams)]

    def open_request_ids(self) -> tuple[str, ...]:
        return tuple(rid for stream in self.streams for rid in stream.open_request_ids())

    async def _pump(self, index: int, stream: RequestStream) -> None:
        async for event in stream:
            for delta in event.choices:
                delta.index += index * self.n
            self._queue.put_nowait(event)

    def __aiter__(self) -> MergedStream:
        return self

    async def __anext__(self) -> StreamEvent:
        if self.finished:
            raise StopAsyncIteration
        event = await self._queue.get()
        if not event.is_last:
            return event
        self._open -= 1
        if event.error is None:
            usage = event.usage
            self._usage = Usage(self._usage.prompt_tokens + usage.prompt_tokens,
                                self._usage.completion_tokens + usage.completion_tokens,
                                self._usage.cached_tokens + usage.cached_tokens)
        if event.error is None and self._open:
            return StreamEvent(event.choices)
        self.finished = True
        for pump in self._pumps:
            pump.cancel()
        return StreamEvent(event.choices, None if event.error else self._usage, event.error)
