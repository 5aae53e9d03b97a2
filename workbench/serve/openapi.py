"""The ``/openapi.json`` the server publishes, true to what it does.

FastAPI's own document describes the request models but not the server: it lists 422 where every refusal here is a
400 (`workbench.serve.errors`), calls every reply ``application/json`` (streams are ``text/event-stream``,
``/metrics`` is Prometheus text, ``/health`` has no body), and cannot know the limits fixed when the engine is built
(``n`` up to ``max_num_seqs``, token ids below the vocabulary size, the served and the emulated model names). So
``install_openapi`` rebuilds it from FastAPI's and ``ROUTE_DOCS``: each operation gets its success body (the
response models below), every error status it can answer with the error shape of its API, and those limits.
An operation missing from ``ROUTE_DOCS`` is an error when the document is built, so a new route cannot go
undocumented. The requests' own ranges come from their pydantic models, which also enforce them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from workbench.serve.errors import MESSAGES_PATH
from workbench.serve.guards import GUARDED_PREFIXES
from workbench.serve.schemas import SEED_RANGE


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | int | None


class ErrorResponse(BaseModel):
    """OpenAI's error shape (every route but /v1/messages)."""

    error: ErrorInfo


class AnthropicErrorInfo(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error shape (/v1/messages)."""

    type: Literal["error"]
    error: AnthropicErrorInfo


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict | None = None


FinishReason = Literal["stop", "length", "abort", "error"] | None
# vLLM's prompt_logprobs: per prompt token (null for the first), {token id: {logprob, rank, decoded_token}}
PromptLogprobs = list[dict[str, dict] | None] | None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict | None
    finish_reason: FinishReason
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it (vLLM's)
    prompt_logprobs: PromptLogprobs = None  # with prompt_logprobs, or echo with logprobs


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict | None
    finish_reason: FinishReason
    stop_reason: str | int | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs = None
    prompt_text: str | None = None  # with return_prompt_text


class TextContent(BaseModel):
    type: Literal["text"]
    text: str


class MessagesResponse(BaseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[TextContent]
    stop_reason: Literal["end_turn", "max_tokens"]
    stop_sequence: None
    usage: dict


class ModelCard(BaseModel):
    """vLLM's model card (``vllm bench serve`` without --model loads its tokenizer from ``root``)."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: str | None
    max_model_len: int
    permission: list[dict]


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


@dataclass(frozen=True, slots=True)
class RouteDoc:
    ok: type[BaseModel] | str | None  # the success body: a model, a media type (text), or None (no body)
    errors: tuple[int, ...]  # every error status the route answers with (401 is added on guarded paths)
    streams: bool = False  # "stream": true answers text/event-stream


GENERATION_ERRORS = (400, 404, 413, 415, 500, 503)
ROUTE_DOCS: dict[tuple[str, str], RouteDoc] = {
    ("get", "/v1/models"): RouteDoc(ModelList, ()),
    ("post", "/v1/completions"): RouteDoc(CompletionResponse, GENERATION_ERRORS, streams=True),
    ("post", "/v1/chat/completions"): RouteDoc(ChatCompletionResponse, GENERATION_ERRORS, streams=True),
    ("post", MESSAGES_PATH): RouteDoc(MessagesResponse, GENERATION_ERRORS),
    ("post", "/hosted/openai/v1/chat/completions"): RouteDoc(ChatCompletionResponse, GENERATION_ERRORS),
    ("post", "/tokenize"): RouteDoc(TokenizeResponse, (400, 404, 413, 415, 500)),
    ("post", "/detokenize"): RouteDoc(DetokenizeResponse, (400, 404, 413, 415, 500)),
    ("get", "/health"): RouteDoc(None, (503,)),
    ("get", "/metrics"): RouteDoc("text/plain", ()),
    ("get", "/version"): RouteDoc(VersionResponse, ()),
}

# One server-sent event of a stream (OpenAPI 3.1: a sequential media type's schema describes each item): its data is
# a JSON chunk in the endpoint's shape, an error object, or the closing [DONE]; events carry no name, id or retry.
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string", "description": "a JSON chunk, an error object, or [DONE]"},
                            "event": {"const": "message"}}}
_REASONS = {400: "the request is invalid (the message names the field and the allowed range)",
            401: "a missing or wrong API key", 404: "an unknown model", 413: "the body is larger than the limit",
            415: "the body is not application/json", 500: "the engine failed this request",
            503: "the server is shutting down"}
_REFUSED_FIELDS = ("Other fields of vLLM's request schemas that this engine does not honour (logit_bias, "
                   "tools, response_format, guided decoding, beam search, stream_interval, ...) are refused with a "
                   "400 naming the field unless they hold their neutral value; unknown fields are ignored.")


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What the document states that only the built engine knows."""

    model_name: str
    max_num_seqs: int
    vocab_size: int
    anthropic_models: tuple[str, ...]
    openai_models: tuple[str, ...]
    api_key: bool


def install_openapi(app: FastAPI, facts: ServerFacts) -> None:
    """Serve ``describe(app, facts)`` as the app's OpenAPI document (built once, on first request)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = describe(app, facts)
        return app.openapi_schema

    app.openapi = openapi


def describe(app: FastAPI, facts: ServerFacts) -> dict:
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                      description="KV Workbench's server: OpenAI's and vLLM's API over the workbench's engine.")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    models = {doc.ok for doc in ROUTE_DOCS.values() if isinstance(doc.ok, type)}
    _, defs = models_json_schema([(m, "serialization") for m in (*models, ErrorResponse, AnthropicErrorResponse)],
                                 ref_template="#/components/schemas/{model}")
    schemas.update(defs["$defs"])
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if (method, path) not in ROUTE_DOCS:
                raise RuntimeError(f"{method.upper()} {path} is not described in workbench.serve.openapi.ROUTE_DOCS")
            operation["responses"] = _responses(path, ROUTE_DOCS[method, path], facts)
    _state_limits(schemas, facts)
    return doc


def _ref(model: type[BaseModel]) -> dict:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _responses(path: str, doc: RouteDoc, facts: ServerFacts) -> dict:
    if doc.ok is None:
        ok = {"description": "OK (no body)"}
    elif isinstance(doc.ok, str):
        ok = {"description": "OK", "content": {doc.ok: {"schema": {"type": "string"}}}}
    else:
        ok = {"description": "OK", "content": {"application/json": {"schema": _ref(doc.ok)}}}
    if doc.streams:
        ok["description"] = "OK: one JSON body, or with \"stream\": true server-sent events ending in [DONE]"
        ok["content"]["text/event-stream"] = {"schema": SSE_EVENT}
    error_model = AnthropicErrorResponse if path == MESSAGES_PATH else ErrorResponse
    statuses = sorted({*doc.errors, *((401,) if facts.api_key and path.startswith(GUARDED_PREFIXES) else ())})
    errors = {str(status): {"description": _REASONS[status],
                            "content": {"application/json": {"schema": _ref(error_model)}}} for status in statuses}
    return {"200": ok, **errors}


def _state_limits(schemas: dict, facts: ServerFacts) -> None:
    """The limits only the built engine knows, into the request schemas."""
    for name in ("CompletionRequest", "ChatCompletionRequest", "CachedChatRequest"):
        # FastAPI's OpenAPI models hold bounds as floats, and 2**63 - 1 does not survive that
        _member(schemas[name]["properties"]["seed"], "integer").update(minimum=SEED_RANGE[0], maximum=SEED_RANGE[1])
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        props = schemas[name]["properties"]
        props["n"]["maximum"] = facts.max_num_seqs
        _member(props["model"], "string")["enum"] = [facts.model_name]
        schemas[name]["description"] = ("prompt (or messages) + max_tokens must fit the model's context. "
                                         + _REFUSED_FIELDS)
    prompt = schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"]
    prompt[1]["items"]["maximum"] = facts.vocab_size - 1
    prompt[3]["items"]["items"]["maximum"] = facts.vocab_size - 1
    for name in ("TokenizeRequest", "DetokenizeRequest"):
        _member(schemas[name]["properties"]["model"], "string")["enum"] = [facts.model_name]
    schemas["TokenizeRequest"]["oneOf"] = [  # exactly one of prompt and messages (null is absent)
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}, "messages": {"type": "null"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}, "prompt": {"type": "null"}}}]
    schemas["DetokenizeRequest"]["properties"]["tokens"]["items"].update(minimum=0, maximum=facts.vocab_size - 1)
    hosted = schemas["CachedChatRequest"]["properties"]
    hosted["n"].update(maximum=1)
    hosted["stream"]["enum"] = [False]
    _member(hosted["model"], "string")["enum"] = list(facts.openai_models)
    messages = schemas["MessagesRequest"]["properties"]
    messages["model"]["enum"] = list(facts.anthropic_models)
    messages["stream"]["enum"] = [False]
    schemas["MessagesRequest"]["description"] = "messages + max_tokens must fit the model's context"


def _member(schema: dict, type_: str) -> dict:
    """The member of an ``anyOf`` (or the schema itself) of JSON type ``type_``."""
    return next(m for m in schema.get("anyOf", [schema]) if m.get("type") == type_)
