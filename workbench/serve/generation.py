"""OpenAI's completions and chat completions (and vLLM's tokenizer endpoints) over the shared ``Pipeline``.

The handler checks what it can without the engine (model name, options), describes the request as a ``Job``
and renders what the pipeline hands back: server-sent events for a streaming reply, one JSON body otherwise.
Tokenizing, the context check, admission and aborting on disconnect are the pipeline's, the same for every route.
"""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from workbench.serve.admission import chat_messages, completion_prompts, render_chat, sampling_params, tokenize
from workbench.serve.errors import APIError
from workbench.serve.pipeline import Job, Pipeline
from workbench.serve.responses import Echo, Responder
from workbench.serve.schemas import ChatCompletionRequest, CompletionRequest, TokenizeRequest


def engine_request_id(response_id: str, unique: str, index: int) -> str:
    """The engine's id for one prompt of an HTTP request: the response's id, a suffix unique to the HTTP request
    (clients may reuse their ids) and the prompt's index in the batch."""
    return f"{response_id}-{unique}-{index}"


def response_id_of(engine_id: str) -> str:
    """The response id an engine request id (`engine_request_id`) was made from."""
    return engine_id.rsplit("-", 2)[0]


class Generator:
    def __init__(self, pipeline: Pipeline, model_name: str, model_root: str | None = None):
        """``model_root``: the checkpoint's folder (/v1/models' ``root``), which names the model too: `vllm bench
        serve` without --model sends it to /tokenize, as vLLM's own server (whose served name is that path) takes."""
        self.pipeline, self.model_name = pipeline, model_name
        self.names = {model_name} | ({model_root} if model_root else set())
        self.max_context = pipeline.max_context
        self.created = int(time.time())

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.names:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    async def tokenize(self, body: TokenizeRequest) -> tuple[list[int], list[str] | None]:
        """The token ids of /tokenize's prompt or messages, and their strings when return_token_strs asks."""
        conflict = body.template_conflict()
        if conflict is not None:
            raise APIError(400, conflict[1], param=conflict[0])
        if body.messages is not None:
            prompt, field, special = chat_messages(body.messages), "messages", bool(body.add_special_tokens)
        else:
            prompt, field = body.prompt, "prompt"
            special = True if body.add_special_tokens is None else body.add_special_tokens

        def run(tokenizer) -> tuple[list[int], list[str] | None]:
            ids = tokenize(tokenizer, prompt, template=body.template_options(), add_special_tokens=special,
                           field=field)
            return ids, tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None

        return await self.pipeline.workers.run(run)

    async def detokenize(self, tokens: list[int]) -> str:
        vocab = self.pipeline.vocab_size

        def decode(tokenizer) -> str:
            if tokens and (min(tokens) < 0 or max(tokens) >= vocab):
                bad = [t for t in tokens if not 0 <= t < vocab][:5]
                raise APIError(400, f"token ids must be in [0, {vocab}), got {bad}", param="tokens")
            return tokenizer.decode(tokens)

        return await self.pipeline.workers.run(decode)

    async def respond(self, body: CompletionRequest | ChatCompletionRequest, request: Request, *,
                      chat: bool) -> Response:
        self.check_model(body.model)
        if chat:
            conflict = body.template_conflict()
            if conflict is not None:
                raise APIError(400, conflict[1], param=conflict[0])
        # max_tokens 0 with echo: one token is generated and left out (vLLM does the same)
        requested = body.requested_max_tokens if chat else max(body.max_tokens, 1)
        params = sampling_params(body, requested, self.pipeline.loop.engine.scheduler_config.max_num_seqs)
        # vLLM's id: the X-Request-Id header, else the request_id field, else random
        base = request.headers.get("x-request-id") or body.request_id or uuid.uuid4().hex
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{base}"
        unique = uuid.uuid4().hex[:8]  # engine ids stay unique when a client reuses its request id
        if chat:
            messages, template = chat_messages(body.messages), body.template_options()
            prompts, field = [messages], "messages"
        else:
            prompts, field, template = completion_prompts(body), "prompt", None
        jobs = [Job(engine_request_id(response_id, unique, i),
                    self._tokenizer_for(prompt, template, body.add_special_tokens, field), params, field)
                for i, prompt in enumerate(prompts)]
        stream = await self.pipeline.start_all(jobs)
        echo = Echo(await self._prompt_texts(prompts), body.echo_only) if not chat and body.echo else None
        prompt_text = None
        if chat and body.return_prompt_text:
            prompt_text = await self.pipeline.workers.run(lambda tokenizer: render_chat(tokenizer, messages, template))
        responder = Responder(response_id, self.model_name, chat=chat, n=params.n, include_usage=body.include_usage,
                              continuous_usage=body.continuous_usage, num_prompt_tokens=stream.num_prompt_tokens,
                              num_choices=stream.num_choices, echo=echo,
                              with_logprobs=body.requested_logprobs is not None, prompt_text=prompt_text)
        if body.stream:
            return self.pipeline.streaming(stream, responder.events)
        got = await self.pipeline.whole(stream, request)
        return JSONResponse(responder.full(got.texts, got.reasons, got.usage, got.logprobs, got.prompt_logprobs,
                                           got.stop_reasons))

    @staticmethod
    def _tokenizer_for(prompt, template: dict | None, add_special_tokens: bool, field: str):
        return lambda tokenizer: tokenize(tokenizer, prompt, template=template, add_special_tokens=add_special_tokens,
                                          field=field)

    async def _prompt_texts(self, prompts: list[str | list[int]]) -> list[str]:
        """Each prompt's text for echo: as sent, or its token ids decoded."""
        if all(isinstance(p, str) for p in prompts):
            return list(prompts)
        return await self.pipeline.workers.run(
            lambda tokenizer: [p if isinstance(p, str) else tokenizer.decode(p) for p in prompts])
