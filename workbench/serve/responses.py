"""OpenAI's response bodies and streaming chunks, for completions and chat completions.

One ``Responder`` per request knows its id, model, kind and choice count, and turns engine events into the
JSON a client expects (each choice's ``logprobs`` in the endpoint's own shape): whole responses,
``data: {...}`` server-sent events, the usage chunk with empty ``choices`` that ``stream_options.include_usage``
asks for, and the closing ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time

from workbench.serve.errors import SERVER_ERROR, error_body
from workbench.serve.streams import ChoiceDelta, LogprobEntry, StreamEvent, Usage

DONE = "data: [DONE]\n\n"


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


# vLLM's floor for a log-probability in a response (JSON has no -inf).
LOGPROB_FLOOR = -9999.0


def _chat_token(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": max(logprob, LOGPROB_FLOOR), "bytes": list(token.encode("utf-8"))}


class Responder:
    def __init__(self, request_id: str, model: str, *, chat: bool, n: int, include_usage: bool = False,
                 continuous_usage: bool = False, num_prompt_tokens: int = 0):
        """``continuous_usage`` (vLLM's ``stream_options.continuous_usage_stats``, with ``include_usage``): every
        chunk carries the usage so far, counted from ``num_prompt_tokens`` and the tokens streamed."""
        self.request_id, self.model, self.chat, self.n = request_id, model, chat, n
        self.include_usage = include_usage
        self.continuous_usage = include_usage and continuous_usage
        self.num_prompt_tokens = num_prompt_tokens
        self._streamed_tokens = 0
        self.created = int(time.time())
        self._opened = False  # the role chunks have been sent
        self._text_offsets = [0] * n  # completions' logprobs.text_offset: where each choice's next token starts

    def logprobs(self, index: int, entries: list[LogprobEntry] | None) -> dict | None:
        """The ``logprobs`` object of one choice (or of one chunk of it), in the endpoint's own shape: chat's
        ``{"content": [...]}`` or completions' parallel lists with text offsets."""
        if entries is None:
            return None
        if self.chat:
            return {"content": [{**_chat_token(e.token, e.logprob),
                                 "top_logprobs": [_chat_token(t, lp) for t, lp in e.top]} for e in entries]}
        offsets = []
        for e in entries:
            offsets.append(self._text_offsets[index])
            self._text_offsets[index] += len(e.token)
        return {"tokens": [e.token for e in entries],
                "token_logprobs": [max(e.logprob, LOGPROB_FLOOR) for e in entries],
                "top_logprobs": [{**{t: max(lp, LOGPROB_FLOOR) for t, lp in e.top},
                                  e.token: max(e.logprob, LOGPROB_FLOOR)} for e in entries],
                "text_offset": offsets}

    def _envelope(self, object_: str, choices: list[dict]) -> dict:
        return {"id": self.request_id, "object": object_, "created": self.created, "model": self.model,
                "choices": choices}

    # ------------------------------------------------------------------------------------------ streaming
    def _chunk(self, choices: list[dict]) -> dict:
        chunk = self._envelope("chat.completion.chunk" if self.chat else "text_completion", choices)
        if self.continuous_usage and choices:
            chunk["usage"] = Usage(self.num_prompt_tokens, self._streamed_tokens, 0).to_dict(details=False)
        elif self.include_usage:
            chunk["usage"] = None  # OpenAI: null on every chunk but the last
        return chunk

    def opening_events(self) -> list[str]:
        """Chat streams name the assistant role once per choice, in a chunk of its own sent together with the
        request's first engine output (its first token), as vLLM does: a client that times the first chunk
        (vLLM's ``bench serve`` does) then measures the time to the first token, not to admission."""
        if not self.chat or self._opened:
            return []
        self._opened = True
        return [sse(self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}])) for i in range(self.n)]

    def _stream_choice(self, delta: ChoiceDelta) -> dict:
        self._streamed_tokens += delta.num_tokens
        if self.chat:
            body = {"index": delta.index, "delta": {"content": delta.text} if delta.text else {}}
        else:
            body = {"index": delta.index, "text": delta.text}
        body.update(logprobs=self.logprobs(delta.index, delta.logprobs), finish_reason=delta.finish_reason)
        return body

    def events(self, event: StreamEvent) -> list[str]:
        """SSE lines for one engine event (the role chunks come with the first, the usage chunk and [DONE] with
        the last one)."""
        out = self.opening_events() + [sse(self._chunk([self._stream_choice(delta)])) for delta in event.choices]
        if event.error is not None:
            out.append(sse(error_body(event.error, SERVER_ERROR, code=500)))
        if event.usage is not None and self.include_usage:
            usage_chunk = self._chunk([])
            usage_chunk["usage"] = event.usage.to_dict()
            out.append(sse(usage_chunk))
        if event.is_last:
            out.append(DONE)
        return out

    # ---------------------------------------------------------------------------------------- whole body
    def full(self, texts: list[str], finish_reasons: list[str | None], usage: Usage,
             logprobs: list[list[LogprobEntry] | None] | None = None) -> dict:
        choices = []
        logprobs = logprobs or [None] * len(texts)
        for index, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True)):
            if self.chat:
                choice = {"index": index, "message": {"role": "assistant", "content": text}}
            else:
                choice = {"index": index, "text": text}
            choice.update(logprobs=self.logprobs(index, logprobs[index]), finish_reason=reason)
            choices.append(choice)
        body = self._envelope("chat.completion" if self.chat else "text_completion", choices)
        body["usage"] = usage.to_dict()
        return body
