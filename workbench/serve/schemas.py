"""The request bodies the server accepts: OpenAI's completions and chat completions, plus vLLM's extensions.

Models are strict (a string where a number belongs is a 400, not silently converted) and ignore fields that
neither OpenAI's nor vLLM's API knows, as their servers do, so newer clients that send extra options still
work. ``null`` stands for "the default" in every optional field, as in vLLM. Ranges here are the API's own
(OpenAI: temperature in [0, 2], top_p in (0, 1]); the engine's ``SamplingParams`` checks its own limits again
when the request reaches it.

vLLM's sampling extensions the engine can do exactly are honoured (``min_p``, ``min_tokens``, the repetition,
frequency and presence penalties, ``stop_token_ids``, ``include_stop_str_in_output``, ``ignore_eos``,
``top_k``), and so are OpenAI's ``logprobs`` / ``top_logprobs`` (the model's raw log-probabilities, as vLLM
returns them by default), ``echo`` and vLLM's ``prompt_logprobs`` (each prompt token's log-probability), batches
of prompts, ``request_id`` and the chat-template options.
Nothing is dropped silently: every field of vLLM's current request schemas is honoured, refused with a 400
naming it, or listed with the reason it cannot change the answer (`workbench.serve.vllm_fields`, checked against
vLLM's own field lists by tests/serve/test_vllm_field_coverage.py).
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from workbench.config import MAX_LOGPROBS
from workbench.serve.vllm_fields import refuse_message_fields, refuse_sent_fields

# OpenAI accepts at most four stop sequences.
MAX_STOP_SEQUENCES = 4
# Prompts in one completions request, and sequences (prompts x n): each prompt becomes a request of its own in the
# engine (vLLM caps the prompts with its VLLM_MAX_COMPLETION_PROMPTS setting).
MAX_PROMPTS = 64
MAX_SEQUENCES_PER_REQUEST = 256
# vLLM bounds the seed to a signed 64-bit integer (its request schemas: _LONG_INFO).
SEED_RANGE = (-(2**63), 2**63 - 1)


def _integral(value: object) -> object:
    """16.0 is the integer 16 (JSON Schema's "integer", and vLLM's lax models, accept it); 16.5 stays a float."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def integer(**bounds: int) -> object:
    """An integer field with ``bounds`` (ge, le, ...): strict (a string such as "16" is refused) but an integral
    float is taken. The bounds come before the validator, so the JSON schema states them as minimum/maximum."""
    return Annotated[int, Field(**bounds), BeforeValidator(_integral)]


Int = integer()
# Text that must hold something besides whitespace (a prompt).
Text = Annotated[str, Field(min_length=1, pattern=r"\S")]
TokenIds = Annotated[list[integer(ge=0)], Field(min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: object) -> object:
        """``"field": null`` is the field's default, as in vLLM (where every optional field defaults to None)."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None or key not in cls.model_fields}
        return data


class _Request(_Strict):
    """A generation request: keeps the fields it does not declare, and refuses by name, before anything else is
    validated, each vLLM field it does not honour that asks for something (`workbench.serve.vllm_fields`)."""

    model_config = ConfigDict(strict=True, extra="allow")
    # Fields of VLLM_FIELDS_REFUSED that this request honours (declared below, with vLLM's meaning).
    HONOURED: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_is_not_done(cls, data: object) -> object:
        if isinstance(data, dict):
            refuse_sent_fields(data, cls.HONOURED)
            refuse_message_fields(data.get("messages"))
        return data


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: the usage so far in every chunk (with include_usage)


class SamplingFields(_Request):
    """What completions and chat completions share."""

    model: str | None = None
    n: integer(ge=1) = 1
    temperature: float | None = Field(None, ge=0, le=2, description=(
        "0 or below 1e-5: greedy; in [1e-5, 1e-2): raised to 1e-2 (vLLM's rules)"))
    top_p: float | None = Field(None, gt=0, le=1, description="the most likely token is always kept")
    top_k: integer(ge=-1) | None = None  # vLLM's extension; -1 or 0 switch it off
    seed: integer(ge=SEED_RANGE[0], le=SEED_RANGE[1]) | None = None
    stop: Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[str, Field(min_length=1)]],
                                                          Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    stop_token_ids: list[integer(ge=0)] | None = None  # vLLM's extension
    ignore_eos: bool = False  # vLLM's extension: generate exactly max_tokens
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Honoured (vLLM's meanings; see SamplingParams): penalties, min-p, min_tokens, keeping the stop string.
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=10)
    min_p: float = Field(0.0, ge=0, le=1)
    min_tokens: integer(ge=0) = Field(0, description="at most max_tokens")
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None  # refused unless empty (declared for the API document)
    user: str | None = None
    # vLLM's: the response's id is "cmpl-<request_id>" ("chatcmpl-" for chat); the X-Request-Id header wins
    request_id: str | None = None
    # vLLM's: each prompt token's log-probability and this many alternatives (not with stream, as in vLLM)
    prompt_logprobs: integer(ge=0, le=MAX_LOGPROBS) | None = None

    def unsupported(self) -> tuple[str, str] | None:
        """(field, reason) for the first option the engine cannot honour, else None."""
        if self.prompt_logprobs is not None and self.stream:
            return "prompt_logprobs", "prompt_logprobs are not available when stream=true (as in vLLM)"
        if self.stream_options is not None and self.stream_options.model_fields_set and not self.stream:
            return "stream_options", "stream_options can only be given with stream=true (as in vLLM)"
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class CompletionRequest(SamplingFields):
    HONOURED: ClassVar[frozenset[str]] = frozenset({"echo"})
    # Text, token ids, or a batch of either (each prompt its own request in the engine, its n choices numbered
    # prompt_index * n + i, as OpenAI and vLLM number them).
    prompt: Text | TokenIds | Annotated[list[Text], Field(min_length=1, max_length=MAX_PROMPTS)] | Annotated[
        list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
    max_tokens: integer(ge=0) | None = Field(16, description="OpenAI's default; 0 only with echo (the prompt alone)")
    logprobs: integer(ge=0, le=MAX_LOGPROBS) | None = None  # top alternatives per token (0: the token's own)
    echo: bool = False  # the prompt before the completion, with its log-probabilities when logprobs is set
    best_of: Int | None = None
    suffix: str | None = None
    add_special_tokens: bool = True  # vLLM's completions default (SmolLM2's tokenizer adds none)

    @property
    def requested_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def requested_prompt_logprobs(self) -> int | None:
        """What the engine computes for the prompt: prompt_logprobs, or with echo, logprobs (as vLLM)."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs if self.echo else None

    @property
    def echo_only(self) -> bool:
        """``max_tokens: 0`` with echo: the prompt alone (one token is still generated and left out, as in vLLM)."""
        return self.echo and self.max_tokens == 0

    def unsupported(self) -> tuple[str, str] | None:
        if self.best_of not in (None, 1, self.n):
            return "best_of", "best_of is not supported by this engine; use n"
        prompts = len(self.prompt) if isinstance(self.prompt, list) and isinstance(self.prompt[0], str | list) else 1
        if prompts > 1 and prompts * self.n > MAX_SEQUENCES_PER_REQUEST:
            return "prompt", (f"{prompts} prompts x n={self.n} asks for {prompts * self.n} sequences; one request "
                              f"takes at most {MAX_SEQUENCES_PER_REQUEST}")
        if self.max_tokens == 0 and not self.echo:
            return "max_tokens", "max_tokens must be >= 1 (0 only with echo=true, which returns the prompt alone)"
        return super().unsupported()


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    """A message as the chat template reads it. name, tool_call_id, tool_calls and reasoning go to the template
    as vLLM passes them (this model's template reads role and content only); reasoning_content is vLLM's older
    name for reasoning."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatTemplateOptions(_Request):
    """vLLM's chat-template options, for chat completions and /tokenize alike."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False  # the last message stays open: the model continues it
    chat_template: str | None = None  # a Jinja template instead of the model's
    chat_template_kwargs: dict[str, Any] | None = None  # more variables for the template
    add_special_tokens: bool = False  # on top of the template's (vLLM's chat default)

    def template_options(self) -> dict[str, Any]:
        """Keyword arguments for ``tokenizer.apply_chat_template``."""
        options = dict(self.chat_template_kwargs or {})
        options.update(add_generation_prompt=self.add_generation_prompt and not self.continue_final_message,
                       continue_final_message=self.continue_final_message)
        if self.chat_template is not None:
            options["chat_template"] = self.chat_template
        return options

    def template_conflict(self) -> tuple[str, str] | None:
        if self.continue_final_message and "add_generation_prompt" in self.model_fields_set and \
                self.add_generation_prompt:
            return "continue_final_message", "continue_final_message and add_generation_prompt cannot both be true"
        return None


class ChatCompletionRequest(ChatTemplateOptions, SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: integer(ge=1) | None = None  # None: whatever the context and the KV pool leave
    max_completion_tokens: integer(ge=1) | None = None
    logprobs: bool = False
    top_logprobs: integer(ge=0, le=MAX_LOGPROBS) | None = None
    return_prompt_text: bool = False  # vLLM's: the prompt the chat template made, as prompt_text

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def unsupported(self) -> tuple[str, str] | None:
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs=true"
        return self.template_conflict() or super().unsupported()


class TokenizeRequest(ChatTemplateOptions):
    """vLLM's /tokenize: a prompt (raw text) or chat messages (through the chat template, with its options)."""

    model: str | None = None
    prompt: Text | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    # None: vLLM's default for the kind of input (True for a prompt, False for messages)
    add_special_tokens: bool | None = None
    return_token_strs: bool = False  # also each token's string (token_strs)


class DetokenizeRequest(_Strict):
    """vLLM's /detokenize: token ids back to text."""

    model: str | None = None
    tokens: list[Int]


def allowed_range(field: str, model: type[BaseModel] | None = None) -> str | None:
    """The API range of a numeric field as ``model``'s JSON schema states it (default: the OpenAI requests), so an
    error message quotes what /openapi.json documents: "[0, 2]", "(0, 1]", ">= 1"."""
    for candidate in (model,) if model is not None else (CompletionRequest, ChatCompletionRequest):
        bounds = _bounds(candidate).get(field)
        if bounds is not None:
            return bounds
    return None


@cache
def _bounds(model: type[BaseModel]) -> dict[str, str]:
    out = {}
    for name, schema in model.model_json_schema().get("properties", {}).items():
        for member in schema.get("anyOf", [schema]):
            low = ("[", member["minimum"]) if "minimum" in member else \
                ("(", member["exclusiveMinimum"]) if "exclusiveMinimum" in member else None
            high = (member["maximum"], "]") if "maximum" in member else \
                (member["exclusiveMaximum"], ")") if "exclusiveMaximum" in member else None
            if low and high:
                out[name] = f"{low[0]}{_number(low[1])}, {_number(high[0])}{high[1]}"
            elif low:
                out[name] = f"{'>=' if low[0] == '[' else '>'} {_number(low[1])}"
            elif high:
                out[name] = f"{'<=' if high[1] == ']' else '<'} {_number(high[0])}"
    return out


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**64 else f"{value:g}"
