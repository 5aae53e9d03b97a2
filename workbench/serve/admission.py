"""From an OpenAI request to what ``LLMEngine.add_request`` takes: token ids and ``SamplingParams``.

Two halves, because the tokenizer belongs to the engine thread (the engine's detokenizers use it between
steps, and a Hugging Face fast tokenizer shared across threads can fail with "Already borrowed"):

- ``sampling_params`` runs in the HTTP handler and refuses bad options at once;
- ``tokenize`` and ``fit_to_context`` run on the engine thread, where the prompt's length is known, so the
  context check can say how many tokens were asked for, and a missing ``max_tokens`` becomes what is left.

The pool check (a request that can never fit the KV cache) stays in the engine, which owns the pool.
"""

from __future__ import annotations

from dataclasses import replace

from workbench.config import SamplingParams
from workbench.prompts import encode_prompt
from workbench.serve.errors import APIError, from_value_error
from workbench.serve.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields

# Chat messages as the tokenizer's chat template reads them.
Messages = list[dict[str, str]]

# OpenAI's default temperature and top_p when a request leaves them out.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0


def sampling_params(request: SamplingFields, max_tokens: int | None, max_n: int) -> SamplingParams:
    """The engine's SamplingParams for ``request`` (``max_tokens`` None: 1 for now, set by fit_to_context)."""
    refused = request.unsupported()
    if refused is not None:
        raise APIError(400, refused[1], param=refused[0])
    if request.n > max_n:
        raise APIError(400, f"n must be in [1, {max_n}] (the engine's max_num_seqs), got {request.n}", param="n")
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    try:
        return SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else max(1, request.min_tokens),
            temperature=DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
            top_p=DEFAULT_TOP_P if request.top_p is None else request.top_p,
            top_k=max(0, request.top_k or 0), seed=request.seed, stop=stop,
            stop_token_ids=tuple(request.stop_token_ids or ()), ignore_eos=request.ignore_eos, n=request.n,
            min_p=request.min_p, min_tokens=request.min_tokens, repetition_penalty=request.repetition_penalty,
            frequency_penalty=request.frequency_penalty, presence_penalty=request.presence_penalty,
            include_stop_str_in_output=request.include_stop_str_in_output, logprobs=request.requested_logprobs)
    except ValueError as exc:
        raise from_value_error(exc) from exc


def completion_prompt(request: CompletionRequest) -> str | list[int]:
    """The one prompt of a completions request (a one-element batch is unwrapped; larger batches are refused)."""
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise APIError(400, f"prompt holds {len(prompt)} prompts; this server takes one prompt per request",
                           param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str) and not prompt:
        raise APIError(400, "prompt must be non-empty text or a non-empty list of token ids", param="prompt")
    if isinstance(prompt, list) and not prompt:
        raise APIError(400, "prompt must be non-empty text or a non-empty list of token ids", param="prompt")
    return prompt


def chat_messages(messages: list[ChatMessage] | None) -> Messages:
    """Messages for the chat template; refuses an empty conversation or a message without text."""
    if not messages:
        raise APIError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for index, message in enumerate(messages):
        if message.content is None and message.role != "assistant":
            raise APIError(400, f"messages[{index}] ({message.role}) has no content", param="messages")
        role = "system" if message.role == "developer" else message.role
        out.append({"role": role, "content": message.text()})
    return out


# ---------------------------------------------------------------------------------- on the engine thread
def tokenize(tokenizer, prompt: str | list[int] | Messages, *, add_generation_prompt: bool = True) -> list[int]:
    """Token ids of raw text, of given ids (checked), or of messages through the chat template."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        if not getattr(tokenizer, "chat_template", None):
            raise APIError(400, "this model has no chat template: use /v1/completions", param="messages")
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=add_generation_prompt, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    try:
        return encode_prompt(tokenizer, prompt, chat=False)
    except ValueError as exc:
        raise APIError(400, str(exc), param="prompt") from exc


def fit_to_context(params: SamplingParams, requested_max_tokens: int | None, num_prompt_tokens: int,
                   max_context: int, pool_tokens: int, prompt_field: str) -> SamplingParams:
    """``params`` with its final max_tokens, or a 400 when prompt + max_tokens exceed the context.

    Without a requested max_tokens, the request may generate up to what the context and the KV pool leave."""
    if requested_max_tokens is None:
        room = min(max_context, pool_tokens) - num_prompt_tokens
        if room < params.min_tokens:
            raise APIError(400, f"min_tokens={params.min_tokens} does not fit: the context and the KV pool leave "
                                f"room for {max(room, 0)} tokens after this {prompt_field}", param="min_tokens")
        return replace(params, max_tokens=max(1, room))
    total = num_prompt_tokens + requested_max_tokens
    if num_prompt_tokens >= max_context or total > max_context:
        param = prompt_field if num_prompt_tokens >= max_context else "max_tokens"
        raise APIError(400, f"this model's maximum context length is {max_context} tokens, you requested {total} "
                            f"tokens ({num_prompt_tokens} in the {prompt_field} + {requested_max_tokens} max_tokens): "
                            f"shorten the {prompt_field} or lower max_tokens",
                       param=param, code="context_length_exceeded")
    return params


def prompt_of(request: CompletionRequest | ChatCompletionRequest) -> tuple[str | list[int] | Messages, str]:
    """The prompt to tokenize and the name of the field it came from."""
    if isinstance(request, ChatCompletionRequest):
        return chat_messages(request.messages), "messages"
    return completion_prompt(request), "prompt"
