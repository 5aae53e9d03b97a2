"""Workload requests as OpenAI request bodies, so the same workload drives any compatible server.

A text prompt goes to ``/v1/chat/completions`` as a user message (after the request's system prompt, if
any): the server applies its own model's chat template, as the offline engine does with ``chat=True``. A
prompt of token ids goes to ``/v1/completions`` as ids, which vLLM and SGLang accept too; the ids mean
something only to a server with the same tokenizer. ``ignore_eos`` (vLLM's extension, honoured by the
workbench) makes output lengths exact; other servers may ignore it.
"""

from __future__ import annotations

from workbench.workloads import WorkloadRequest

ENDPOINTS = ("auto", "chat", "completions")
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def endpoint_for(request: WorkloadRequest, endpoint: str = "auto") -> str:
    """'chat' or 'completions' for this request."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {ENDPOINTS}, got {endpoint!r}")
    ids = isinstance(request.prompt, list)
    if endpoint == "auto":
        return "completions" if ids else "chat"
    if endpoint == "chat" and ids:
        raise ValueError("a prompt of token ids cannot go to the chat endpoint: use endpoint='completions'")
    return endpoint


def request_body(request: WorkloadRequest, model: str, endpoint: str, *, stream: bool = True) -> dict:
    """The JSON body for ``endpoint`` ('chat' or 'completions')."""
    body: dict = {"model": model, "max_tokens": request.max_tokens, "temperature": request.temperature,
                  "stream": stream}
    if request.temperature > 0:
        body["seed"] = 0  # as WorkloadRequest.sampling_params does offline: reproducible sampled runs
    if request.ignore_eos:
        body["ignore_eos"] = True
    if stream:
        body["stream_options"] = {"include_usage": True}
    if endpoint == "chat":
        messages = [{"role": "system", "content": request.system}] if request.system is not None else []
        messages.append({"role": "user", "content": request.prompt})
        body["messages"] = messages
    else:
        if request.system is not None and isinstance(request.prompt, str):
            body["prompt"] = f"{request.system}\n\n{request.prompt}"
        else:
            body["prompt"] = request.prompt
    return body
