"""What travels from the engine thread to one HTTP handler: a request's output, piece by piece.

The engine thread turns each step's outputs into ``StreamEvent`` s (new text and token counts per choice)
and hands them to the request's ``RequestStream`` through ``loop.call_soon_threadsafe``; the handler, on the
event loop, iterates the stream. The last event of every request carries its ``Usage`` (or an error), so
a handler never waits for an event that will not come.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from workbench.engine.outputs import RequestOutput
from workbench.sampling import TokenLogprob


@dataclass(slots=True, frozen=True)
class LogprobEntry:
    """One token's log-probability and its top alternatives, with their texts (for the response); a prompt's
    first token has none (``logprob`` None). Prompt tokens also carry their ids and rank, for vLLM's
    ``prompt_logprobs`` (a dict by token id)."""

    token: str
    logprob: float | None
    top: tuple[tuple[str, float], ...]
    token_id: int | None = None
    rank: int | None = None
    top_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class ChoiceDelta:
    index: int
    text: str
    num_tokens: int
    finish_reason: str | None = None
    logprobs: list[LogprobEntry] | None = None  # one per new token, when the request asked for them
    stop_reason: str | int | None = None  # with finish_reason "stop": the stop string or token id (vLLM's)
    # on a choice's first delta, when the request asked for prompt log-probabilities: one per prompt token
    prompt_logprobs: list[LogprobEntry] | None = None


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache

    def to_dict(self, details: bool = True) -> dict:
        counts = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                  "total_tokens": self.prompt_tokens + self.completion_tokens}
        return {**counts, "prompt_tokens_details": {"cached_tokens": self.cached_tokens}} if details else counts


@dataclass(slots=True)
class StreamEvent:
    choices: list[ChoiceDelta]
    usage: Usage | None = None  # set on the request's last event
    error: str | None = None  # the engine failed this request; also the last event

    @property
    def is_last(self) -> bool:
        return self.usage is not None or self.error is not None


class RequestStream:
    """One request's events, produced on the engine thread and consumed on the event loop."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop, num_choices: int = 1):
        self.request_id = request_id
        self.num_choices = num_choices  # the request's n
        self.num_prompt_tokens = 0
        self.finished = False  # the last event has been consumed
        self._loop = loop
        self._queue: asyncio.Queue[StreamEvent] = asyncio.Queue()

    def open_request_ids(self) -> tuple[str, ...]:
        """The engine requests still running for this stream (to abort when its client leaves)."""
        return () if self.finished else (self.request_id,)

    def push(self, event: StreamEvent) -> None:
        """Called from the engine thread."""
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is listening any more
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StreamEvent:
        if self.finished:
            raise StopAsyncIteration
        event = await self._queue.get()
        self.finished = event.is_last
        return event


class DeltaTracker:
    """How much of each choice has been sent, so cumulative engine outputs become deltas."""

    __slots__ = ("stream", "sent_tokens", "sent_chars", "done", "counted_prompt", "token_text", "sent_prompt")

    def __init__(self, stream: RequestStream, num_choices: int, token_text: Callable[[int], str] | None = None):
        """``token_text(id)``: one token's text, for the log-probabilities of requests that ask for them."""
        self.stream = stream
        self.token_text = token_text
        self.sent_tokens = [0] * num_choices
        self.sent_chars = [0] * num_choices
        self.done = [False] * num_choices
        self.counted_prompt = False  # its prompt tokens went into vllm:prompt_tokens
        self.sent_prompt = [False] * num_choices  # its prompt log-probabilities went with its first delta

    def deltas(self, output: RequestOutput) -> list[ChoiceDelta]:
        out = []
        for completion in output.outputs:
            i = completion.index
            new_tokens = len(completion.token_ids) - self.sent_tokens[i]
            text = completion.text[self.sent_chars[i]:]
            closing = completion.finish_reason is not None and not self.done[i]
            if new_tokens or text or closing:
                prompt = None
                if output.prompt_logprobs is not None and not self.sent_prompt[i]:
                    self.sent_prompt[i] = True
                    prompt = self._prompt_logprobs(output.prompt_logprobs, output.prompt_ids)
                out.append(ChoiceDelta(i, text, new_tokens, completion.finish_reason,
                                       self._logprobs(completion.logprobs, self.sent_tokens[i]),
                                       completion.stop_reason, prompt))
            self.sent_tokens[i] = len(completion.token_ids)
            self.sent_chars[i] = len(completion.text)
            self.done[i] = self.done[i] or closing
        return out

    def _logprobs(self, logprobs: list[TokenLogprob] | None, start: int) -> list[LogprobEntry] | None:
        if logprobs is None or self.token_text is None:
            return None
        name = self.token_text
        return [LogprobEntry(name(e.token_id), e.logprob, tuple((name(t), lp) for t, lp in e.top))
                for e in logprobs[start:]]

    def _prompt_logprobs(self, logprobs: list[TokenLogprob | None], prompt_ids: list[int]) -> list[LogprobEntry]:
        name = self.token_text or str
        return [LogprobEntry(name(token), None, (), token) if e is None else
                LogprobEntry(name(token), e.logprob, tuple((name(t), lp) for t, lp in e.top), token, e.rank,
                             tuple(t for t, _ in e.top))
                for token, e in zip(prompt_ids, logprobs, strict=True)]

    def close_all(self, reason: str) -> list[ChoiceDelta]:
        """Closing deltas for the choices still open, for a request ended outside a step (abort, shutdown)."""
        out = [ChoiceDelta(i, "", 0, reason) for i, done in enumerate(self.done) if not done]
        self.done = [True] * len(self.done)
        return out

    @property
    def completion_tokens(self) -> int:
        return sum(self.sent_tokens)
