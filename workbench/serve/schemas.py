"""The request bodies the server accepts: OpenAI's completions and chat completions, plus vLLM's extensions.

Models are strict (a string where a number belongs is a 400, not silently converted) and ignore fields they
do not know, as OpenAI's and vLLM's servers do, so newer clients that send extra options still work. Ranges
here are the API's own (OpenAI: temperature in [0, 2], top_p in (0, 1]); the engine's ``SamplingParams``
checks its own limits again when the request reaches it. Options the engine cannot honour (penalties, logit
bias, logprobs) are refused with a 400 rather than ignored, so a client never gets an answer it did not ask
for.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# OpenAI accepts at most four stop sequences.
MAX_STOP_SEQUENCES = 4


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class SamplingFields(_Strict):
    """What completions and chat completions share."""

    model: str | None = None
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # vLLM's extension; -1 or 0 switch it off
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM's extension
    ignore_eos: bool = False  # vLLM's extension: generate exactly max_tokens
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def unsupported(self) -> tuple[str, str] | None:
        """(field, reason) for the first option the engine cannot honour, else None."""
        if self.presence_penalty or self.frequency_penalty:
            name = "presence_penalty" if self.presence_penalty else "frequency_penalty"
            return name, f"{name} is not supported by this engine; leave it at 0"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported by this engine"
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOP_SEQUENCES:
            return "stop", f"stop takes at most {MAX_STOP_SEQUENCES} sequences, got {len(self.stop)}"
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.logprobs is not None:
            return "logprobs", "logprobs are not supported by this engine"
        if self.echo:
            return "echo", "echo is not supported by this engine"
        if self.best_of not in (None, 1, self.n):
            return "best_of", "best_of is not supported by this engine; use n"
        if self.suffix:
            return "suffix", "suffix is not supported by this engine"
        return super().unsupported()


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = Field(None, ge=1)  # None: whatever the context and the KV pool leave
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.logprobs or self.top_logprobs:
            return "logprobs", "logprobs are not supported by this engine"
        return super().unsupported()

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(_Strict):
    """vLLM's /tokenize: a prompt (raw text) or chat messages (through the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True


def allowed_range(field: str) -> str | None:
    """The API range of a numeric field, from its declaration above: "[0, 2]", "(0, 1]", ">= 1"."""
    for model in (CompletionRequest, ChatCompletionRequest):
        info = model.model_fields.get(field)
        if info is None:
            continue
        bounds = {name: getattr(m, name) for m in info.metadata for name in ("ge", "gt", "le", "lt")
                  if hasattr(m, name)}
        low = ("[", bounds["ge"]) if "ge" in bounds else ("(", bounds["gt"]) if "gt" in bounds else None
        high = (bounds["le"], "]") if "le" in bounds else (bounds["lt"], ")") if "lt" in bounds else None
        if low and high:
            return f"{low[0]}{low[1]:g}, {high[0]:g}{high[1]}"
        if low:
            return f"{'>=' if low[0] == '[' else '>'} {low[1]:g}"
        if high:
            return f"{'<=' if high[1] == ']' else '<'} {high[0]:g}"
    return None
