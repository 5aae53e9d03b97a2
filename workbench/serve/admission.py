"""From an API request to what ``LLMEngine.add_request`` takes: token ids and ``SamplingParams``.

Everything here runs before the engine thread sees the request, so a bad request is refused (400) without
touching the shared engine step:

- ``sampling_params`` runs in the HTTP handler and refuses bad options at once;
- ``tokenize`` runs on a text worker (`workbench.serve.text_workers`), never on the engine thread, and turns any
  error of the tokenizer or the chat template into a 400 naming the field, as vLLM's preprocessing does;
- ``check_vocabulary`` refuses given token ids outside the model's vocabulary.

``max_tokens`` is passed on as the client sent it (None when it sent none): the engine owns its one policy
(`workbench.engine.requests.resolved_max_tokens`: refused past the context, what the context and the KV pool
leave when missing), which the pipeline runs before admitting the request (`workbench.serve.pipeline`).
"""

from __future__ import annotations

import jinja2

from workbench.config import SamplingParams
from workbench.prompts import encode_prompt
from workbench.serve.errors import APIError, from_value_error
from workbench.serve.schemas import ChatMessage, CompletionRequest, SamplingFields

# Chat messages as the tokenizer's chat template reads them.
Messages = list[dict[str, str]]

# OpenAI's default temperature and top_p when a request leaves them out.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0


def sampling_params(request: SamplingFields, max_tokens: int | None, max_n: int,
                    default_temperature: float = DEFAULT_TEMPERATURE) -> SamplingParams:
    """The engine's SamplingParams for ``request`` (``max_tokens`` None: what the context and the pool leave)."""
    refused = request.unsupported()
    if refused is not None:
        raise APIError(400, refused[1], param=refused[0])
    if request.n > max_n:
        raise APIError(400, f"n must be in [1, {max_n}] (the engine's max_num_seqs), got {request.n}", param="n")
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=default_temperature if request.temperature is None else request.temperature,
            top_p=DEFAULT_TOP_P if request.top_p is None else request.top_p,
            top_k=max(0, request.top_k or 0), seed=request.seed, stop=stop,
            stop_token_ids=tuple(request.stop_token_ids or ()), ignore_eos=request.ignore_eos, n=request.n,
            min_p=request.min_p, min_tokens=request.min_tokens, repetition_penalty=request.repetition_penalty,
            frequency_penalty=request.frequency_penalty, presence_penalty=request.presence_penalty,
            include_stop_str_in_output=request.include_stop_str_in_output, logprobs=request.requested_logprobs,
            prompt_logprobs=getattr(request, "requested_prompt_logprobs", request.prompt_logprobs))
    except ValueError as exc:
        raise from_value_error(exc) from exc


def completion_prompts(request: CompletionRequest) -> list[str | list[int]]:
    """The prompts of a completions request: one, or each of a batch (texts or token-id lists)."""
    prompt = request.prompt
    prompts = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list) else [prompt]
    for index, one in enumerate(prompts):
        if not one:
            where = f"prompt[{index}]" if len(prompts) > 1 else "prompt"
            raise APIError(400, f"{where} must be non-empty text or a non-empty list of token ids", param="prompt")
    return prompts


def chat_messages(messages: list[ChatMessage] | None) -> Messages:
    """Messages for the chat template, with the fields vLLM hands it too (name, tool calls, reasoning); refuses
    an empty conversation or a message without text."""
    if not messages:
        raise APIError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for index, message in enumerate(messages):
        if message.content is None and message.role != "assistant":
            raise APIError(400, f"messages[{index}] ({message.role}) has no content", param="messages")
        role = "system" if message.role == "developer" else message.role
        entry: dict = {"role": role, "content": message.text()}
        reasoning = message.reasoning if message.reasoning is not None else message.reasoning_content
        extra = {"name": message.name, "tool_call_id": message.tool_call_id, "tool_calls": message.tool_calls,
                 "reasoning": reasoning}
        entry.update({key: value for key, value in extra.items() if value is not None})
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------- on a text worker
# What a tokenizer or a chat template raises for input it cannot take (vLLM catches the same in preprocessing).
_TOKENIZER_ERRORS = (TypeError, RuntimeError, jinja2.TemplateError)


def tokenize(tokenizer, prompt: str | list[int] | Messages, *, template: dict | None = None,
             add_special_tokens: bool = False, field: str = "prompt") -> list[int]:
    """Token ids of raw text, of given ids (checked), or of messages through the chat template (``template``:
    `ChatTemplateOptions.template_options`, default: add the generation prompt)."""
    try:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            text = render_chat(tokenizer, prompt, template)
            return tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        if isinstance(prompt, str) and add_special_tokens:
            encode_prompt(tokenizer, prompt, chat=False)  # its checks
            return tokenizer(prompt, add_special_tokens=True)["input_ids"]
        return encode_prompt(tokenizer, prompt, chat=False)
    except ValueError as exc:  # the project's own checks: their messages name the value already
        raise APIError(400, str(exc), param=field) from exc
    except _TOKENIZER_ERRORS as exc:
        raise APIError(400, f"the {field} could not be tokenized ({type(exc).__name__}: {exc})", param=field) from exc


def render_chat(tokenizer, messages: Messages, template: dict | None = None) -> str:
    """The prompt text the chat template makes of ``messages`` (raises as ``tokenize`` maps)."""
    template = {"add_generation_prompt": True} if template is None else template
    if not getattr(tokenizer, "chat_template", None) and "chat_template" not in template:
        raise APIError(400, "this model has no chat template: use /v1/completions", param="messages")
    return tokenizer.apply_chat_template(messages, tokenize=False, **template)


def check_vocabulary(ids: list[int], vocab_size: int, field: str) -> None:
    """A 400 naming ``field`` when a given token id is outside the model's vocabulary."""
    if ids and max(ids) >= vocab_size:
        bad = next(t for t in ids if t >= vocab_size)
        raise APIError(400, f"token id {bad} is outside the vocabulary [0, {vocab_size})", param=field)
