"""OpenAI's response bodies and streaming chunks, for completions and chat completions.

One ``Responder`` per request knows its id, model, kind and choice count, and turns engine events into the
JSON a client expects (each choice's ``logprobs`` in the endpoint's own shape): whole responses,
``data: {...}`` server-sent events, the usage chunk with empty ``choices`` that ``stream_options.include_usage``
asks for, and the closing ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from workbench.serve.errors import SERVER_ERROR, error_body
from workbench.serve.streams import ChoiceDelta, LogprobEntry, StreamEvent, Usage

DONE = "data: [DONE]\n\n"


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


# vLLM's floor for a log-probability in a response (JSON has no -inf, nor NaN).
LOGPROB_FLOOR = -9999.0


def _floor(logprob: float) -> float:
    return logprob if logprob == logprob and logprob > LOGPROB_FLOOR else LOGPROB_FLOOR


def _chat_token(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": _floor(logprob), "bytes": list(token.encode("utf-8"))}


def vllm_prompt_logprobs(entries: list[LogprobEntry]) -> list[dict | None]:
    """vLLM's ``prompt_logprobs``: per prompt token (None for the first), a dict by token id of
    ``{logprob, rank, decoded_token}`` holding the prompt's token and the requested top alternatives."""
    out: list[dict | None] = []
    for e in entries:
        if e.logprob is None:
            out.append(None)
            continue
        by_id = {str(e.token_id): {"logprob": _floor(e.logprob), "rank": e.rank, "decoded_token": e.token}}
        for rank, (token_id, (text, logprob)) in enumerate(zip(e.top_ids, e.top, strict=True), start=1):
            by_id.setdefault(str(token_id), {"logprob": _floor(logprob), "rank": rank, "decoded_token": text})
        out.append(by_id)
    return out


@dataclass(frozen=True, slots=True)
class Echo:
    """What OpenAI's ``echo`` puts before each completion: its prompt's text (per prompt of the request); with
    ``only`` (``max_tokens: 0``), the prompt alone."""

    texts: list[str]
    only: bool = False


class Responder:
    def __init__(self, request_id: str, model: str, *, chat: bool, n: int, include_usage: bool = False,
                 continuous_usage: bool = False, num_prompt_tokens: int = 0, num_choices: int | None = None,
                 echo: Echo | None = None, with_logprobs: bool = False, prompt_text: str | None = None):
        """``continuous_usage`` (vLLM's ``stream_options.continuous_usage_stats``, with ``include_usage``): every
        chunk carries the usage so far, counted from ``num_prompt_tokens`` and the tokens streamed. ``num_choices``:
        n per prompt times the prompts (default n). ``with_logprobs``: the request asked for ``logprobs`` (an echoed
        prompt's then come first). ``prompt_text``: chat's rendered prompt, returned (vLLM's return_prompt_text)."""
        self.request_id, self.model, self.chat, self.n = request_id, model, chat, n
        self.num_choices = num_choices or n
        self.include_usage = include_usage
        self.continuous_usage = include_usage and continuous_usage
        self.num_prompt_tokens = num_prompt_tokens
        self.echo, self.with_logprobs, self.prompt_text = echo, with_logprobs, prompt_text
        self._streamed_tokens = 0
        self.created = int(time.time())
        self._opened = False  # the role chunks have been sent
        self._echoed = [False] * self.num_choices
        self._text_offsets = [0] * self.num_choices  # completions' logprobs.text_offset: where the next token starts

    def logprobs(self, index: int, entries: list[LogprobEntry] | None) -> dict | None:
        """The ``logprobs`` object of one choice (or of one chunk of it), in the endpoint's own shape: chat's
        ``{"content": [...]}`` or completions' parallel lists with text offsets (an echoed prompt's first token
        has null log-probabilities)."""
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
                "token_logprobs": [None if e.logprob is None else _floor(e.logprob) for e in entries],
                "top_logprobs": [None if e.logprob is None else
                                 {**{t: _floor(lp) for t, lp in e.top}, e.token: _floor(e.logprob)} for e in entries],
                "text_offset": offsets}

    def _echoed_choice(self, index: int, text: str, generated: list[LogprobEntry] | None,
                       prompt: list[LogprobEntry] | None) -> tuple[str, list[LogprobEntry] | None]:
        """A choice's text and log-probabilities with its prompt before them the first time (``echo``)."""
        if self.echo is None:
            return text, generated
        if self.echo.only:
            text, generated = "", [] if generated is not None else None
        if self._echoed[index]:
            return text, generated if self.with_logprobs else None
        self._echoed[index] = True
        text = self.echo.texts[index // self.n] + text
        return text, (prompt or []) + (generated or []) if self.with_logprobs else None

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
        chunks = [self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}]) for i in range(self.n)]
        if self.prompt_text is not None:
            chunks[0]["prompt_text"] = self.prompt_text  # vLLM: on the first chunk only
        return [sse(chunk) for chunk in chunks]

    def _stream_choice(self, delta: ChoiceDelta) -> dict:
        self._streamed_tokens += delta.num_tokens
        text, entries = self._echoed_choice(delta.index, delta.text, delta.logprobs, delta.prompt_logprobs)
        if self.chat:
            body = {"index": delta.index, "delta": {"content": text} if text else {}}
        else:
            body = {"index": delta.index, "text": text}
        body.update(logprobs=self.logprobs(delta.index, entries), finish_reason=delta.finish_reason,
                    stop_reason=delta.stop_reason)
        return body

    def events(self, event: StreamEvent) -> list[str]:
        """SSE lines for one engine event (the role chunks come with the first, the usage chunk and [DONE] with
        the last one). An engine error ends the stream with the error alone, as vLLM's does: the choices it
        closed get no finish chunk of their own."""
        deltas = event.choices if event.error is None else [d for d in event.choices if d.text or d.num_tokens]
        out = self.opening_events() + [sse(self._chunk([self._stream_choice(delta)])) for delta in deltas]
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
             logprobs: list[list[LogprobEntry] | None] | None = None,
             prompt_logprobs: list[list[LogprobEntry] | None] | None = None,
             stop_reasons: list[str | int | None] | None = None) -> dict:
        choices = []
        logprobs = logprobs or [None] * len(texts)
        prompt_logprobs = prompt_logprobs or [None] * len(texts)
        stop_reasons = stop_reasons or [None] * len(texts)
        for index, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True)):
            text, entries = self._echoed_choice(index, text, logprobs[index], prompt_logprobs[index])
            if self.chat:
                choice = {"index": index, "message": {"role": "assistant", "content": text}}
            else:
                choice = {"index": index, "text": text}
            choice.update(logprobs=self.logprobs(index, entries), finish_reason=reason,
                          stop_reason=stop_reasons[index])
            if not self.chat and prompt_logprobs[index] is not None:
                choice["prompt_logprobs"] = vllm_prompt_logprobs(prompt_logprobs[index])
            choices.append(choice)
        body = self._envelope("chat.completion" if self.chat else "text_completion", choices)
        if self.chat and prompt_logprobs[0] is not None:
            body["prompt_logprobs"] = vllm_prompt_logprobs(prompt_logprobs[0])
        if self.chat and self.prompt_text is not None:
            body["prompt_text"] = self.prompt_text
        body["usage"] = usage.to_dict()
        return body
