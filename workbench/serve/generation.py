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

from workbench.serve.admission import chat_messages, prompt_of, sampling_params, tokenize
from workbench.serve.errors import APIError
from workbench.serve.pipeline import Job, Pipeline
from workbench.serve.responses import Responder
from workbench.serve.schemas import ChatCompletionRequest, CompletionRequest, TokenizeRequest


class Generator:
    def __init__(self, pipeline: Pipeline, model_name: str):
        self.pipeline, self.model_name = pipeline, model_name
        self.max_context = pipeline.max_context
        self.created = int(time.time())

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    async def tokenize(self, body: TokenizeRequest) -> list[int]:
        if body.messages is not None:
            prompt, field = chat_messages(body.messages), "messages"
        else:
            prompt, field = body.prompt, "prompt"
        return await self.pipeline.workers.run(lambda tokenizer: tokenize(
            tokenizer, prompt, add_generation_prompt=body.add_generation_prompt, field=field))

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
        requested = body.requested_max_tokens if chat else body.max_tokens
        params = sampling_params(body, requested, self.pipeline.loop.engine.scheduler_config.max_num_seqs)
        prompt, prompt_field = prompt_of(body)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        job = Job(request_id, lambda tokenizer: tokenize(tokenizer, prompt, field=prompt_field), params, requested,
                  prompt_field)
        stream = await self.pipeline.start(job)
        responder = Responder(request_id, self.model_name, chat=chat, n=params.n, include_usage=body.include_usage,
                              continuous_usage=body.continuous_usage, num_prompt_tokens=stream.num_prompt_tokens)
        if body.stream:
            return self.pipeline.streaming(stream, responder.events)
        got = await self.pipeline.whole(stream, request)
        return JSONResponse(responder.full(got.texts, got.reasons, got.usage, got.logprobs))
