"""The request bodies the server accepts: OpenAI's completions and chat completions, plus vLLM's extensions.

Models are strict (a string where a number belongs is a 400, not silently converted) and ignore fields that
neither OpenAI's nor vLLM's API knows, as their servers do, so newer clients that send extra options still
work. ``null`` stands for "the default" in every optional field, as in vLLM. Ranges here are the API's own
(OpenAI: temperature in [0, 2], top_p in (0, 1]); the engine's ``SamplingParams`` checks its own limits again
when the request reaches it.

vLLM's sampling extensions the engine can do exactly are honoured (``min_p``, ``min_tokens``, the repetition,
frequency and presence penalties, ``stop_token_ids``, ``include_stop_str_in_output``, ``ignore_eos``,
``top_k``), and so are OpenAI's ``logprobs`` / ``top_logprobs`` (the model's raw log-probabilities, as vLLM
returns them by default).
Nothing is dropped silently: every other field of vLLM's request schemas (0.10-0.11, as recalled here) that the
engine does not honour (``VLLM_FIELDS_REFUSED``: logit bias, prompt logprobs, tools, structured output, beam search,
...) is refused with a 400 naming it when it asks for anything but the neutral value, so a client
never gets an answer it did not ask for.
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from workbench.config import MAX_LOGPROBS

# OpenAI accepts at most four stop sequences.
MAX_STOP_SEQUENCES = 4
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


# vLLM's request fields the engine does not honour, each with the values that ask for nothing (sent by clients
# that fill in every field); any other value is refused with a 400 that names the field.
_OFF = (None, False, 0, 0.0, "", [], {})
VLLM_FIELDS_REFUSED: dict[str, tuple] = {
    "logit_bias": _OFF, "prompt_logprobs": _OFF,
    "length_penalty": (None, 1, 1.0), "use_beam_search": _OFF, "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True), "truncate_prompt_tokens": _OFF, "allowed_token_ids": _OFF,
    "bad_words": _OFF, "tools": _OFF, "tool_choice": (None, "none", "auto"), "parallel_tool_calls": (None, True, False),
    "functions": _OFF, "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}), "guided_json": _OFF, "guided_regex": _OFF, "guided_choice": _OFF,
    "guided_grammar": _OFF, "guided_decoding_backend": _OFF, "guided_whitespace_pattern": _OFF,
    "structural_tag": _OFF, "structured_outputs": _OFF, "reasoning_effort": _OFF, "include_reasoning": (None, True),
    "echo": _OFF, "suffix": _OFF, "continue_final_message": _OFF, "documents": _OFF, "chat_template": _OFF,
    "chat_template_kwargs": _OFF, "mm_processor_kwargs": _OFF, "add_special_tokens": _OFF, "priority": _OFF,
    "logits_processors": _OFF, "return_tokens_as_token_ids": _OFF, "return_token_ids": _OFF, "cache_salt": _OFF,
    "kv_transfer_params": _OFF, "vllm_xargs": _OFF, "audio": _OFF, "modalities": (None, ["text"]),
    "prediction": _OFF, "service_tier": (None, "auto", "default"),
}


def _asks_for_nothing(field: str, value: object) -> bool:
    return any(value == neutral and type(value) is type(neutral) for neutral in VLLM_FIELDS_REFUSED[field])


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: object) -> object:
        """``"field": null`` is the field's default, as in vLLM (where every optional field defaults to None)."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None or key not in cls.model_fields}
        return data

    def refused_vllm_field(self) -> tuple[str, str] | None:
        """(field, reason) for the first vLLM request field set to something this engine does not do."""
        sent = {**(self.model_extra or {}), **{name: getattr(self, name) for name in self.model_fields_set}}
        for name, value in sent.items():
            if name in VLLM_FIELDS_REFUSED and not _asks_for_nothing(name, value):
                return name, f"{name}={value!r} is not supported by this engine (it would be ignored, so it is refused)"
        return None


class _Request(_Strict):
    """A generation request: keeps the fields it does not declare, so that vLLM's can be refused by name."""

    model_config = ConfigDict(strict=True, extra="allow")


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
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def unsupported(self) -> tuple[str, str] | None:
        """(field, reason) for the first option the engine cannot honour, else None."""
        return self.refused_vllm_field()

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class CompletionRequest(SamplingFields):
    # One prompt per request: text, token ids, or a batch of exactly one of either.
    prompt: Text | TokenIds | Annotated[list[Text], Field(min_length=1, max_length=1)] | Annotated[
        list[TokenIds], Field(min_length=1, max_length=1)]
    max_tokens: integer(ge=1) | None = 16  # OpenAI's default for completions
    logprobs: integer(ge=0, le=MAX_LOGPROBS) | None = None  # top alternatives per token (0: the token's own)
    echo: bool = False
    best_of: Int | None = None
    suffix: str | None = None

    @property
    def requested_logprobs(self) -> int | None:
        return self.logprobs

    def unsupported(self) -> tuple[str, str] | None:
        if self.best_of not in (None, 1, self.n):
            return "best_of", "best_of is not supported by this engine; use n"
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
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: integer(ge=1) | None = None  # None: whatever the context and the KV pool leave
    max_completion_tokens: integer(ge=1) | None = None
    logprobs: bool = False
    top_logprobs: integer(ge=0, le=MAX_LOGPROBS) | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def unsupported(self) -> tuple[str, str] | None:
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs=true"
        return super().unsupported()


class TokenizeRequest(_Strict):
    """vLLM's /tokenize: a prompt (raw text) or chat messages (through the chat template)."""

    model: str | None = None
    prompt: Text | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_generation_prompt: bool = True


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
