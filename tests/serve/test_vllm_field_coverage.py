"""Every field of vLLM's current request schemas is honoured, refused by name, or listed with the reason it changes
nothing here: never silently dropped.

vLLM's field lists are data (``datasets/vllm/request_fields.json``, with the vLLM commits they were read at). The
first test sorts each field into the server's three groups (`workbench.serve.vllm_fields`) and fails naming any
field in none of them, so a vLLM upgrade that adds fields fails here until each new one is decided. The others ask a
live server: each refused field, sent with a value that asks for something, is a 400 naming it (also with
``prompt`` missing, for ``prompt_embeds``); each field without effect is accepted; each message-level field is passed
to the chat template or refused.
"""

from __future__ import annotations

import httpx
import pytest
from serve_helpers import MODEL, make_engine, running_server

from workbench.serve.schemas import ChatCompletionRequest, CompletionRequest, TokenizeRequest
from workbench.serve.vllm_fields import (
    MESSAGE_FIELDS_REFUSED,
    MESSAGE_FIELDS_TO_TEMPLATE,
    VLLM_FIELDS_REFUSED,
    VLLM_FIELDS_WITHOUT_EFFECT,
    vllm_field_lists,
)

ENDPOINTS = {"completion": (CompletionRequest, "/v1/completions"), "chat": (ChatCompletionRequest,
                                                                             "/v1/chat/completions"),
             "tokenize_completion": (TokenizeRequest, "/tokenize"), "tokenize_chat": (TokenizeRequest, "/tokenize")}
BASE = {"completion": {"model": MODEL, "prompt": "Hello", "max_tokens": 1},
        "chat": {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1},
        "tokenize_completion": {"model": MODEL, "prompt": "Hello"},
        "tokenize_chat": {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}]}}
# A value that asks for something, for every refused field (a field refused without one here fails the test)
ASKING = {
    "logit_bias": {"5": 1.0}, "length_penalty": 2.0, "use_beam_search": True, "skip_special_tokens": False,
    "spaces_between_special_tokens": False, "truncate_prompt_tokens": 5, "allowed_token_ids": [1, 2],
    "bad_words": ["x"], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
    "response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"}, "reasoning_effort": "low",
    "include_reasoning": False, "echo": True, "suffix": "x", "documents": [{"title": "a", "text": "b"}],
    "mm_processor_kwargs": {"a": 1}, "priority": 1, "return_tokens_as_token_ids": True, "return_token_ids": True,
    "cache_salt": "salt", "kv_transfer_params": {"a": 1}, "ec_transfer_params": {"a": 1}, "vllm_xargs": {"a": 1},
    "watermarking": True, "logprob_token_ids": [1], "prompt_embeds": "AAAA", "thinking_token_budget": 10,
    "repetition_detection": {"max_pattern_size": 4, "min_count": 3}, "stream_interval": 4,
    "media_io_kwargs": {"image": {"a": 1}},
}
NO_EFFECT_VALUES = {"user": "someone", "session_id": "s-1", "truncation_side": "left", "routed_experts_prompt_start": 3,
                    "return_token_offsets": True, "return_mm_kwargs": False, "parallel_tool_calls": False}


def _groups(kind: str) -> dict[str, str]:
    model = ENDPOINTS[kind][0]
    out = {}
    for field in vllm_field_lists()[kind]:
        refused = field in VLLM_FIELDS_REFUSED and field not in model.HONOURED
        if refused:
            out[field] = "refused"
        elif field in model.model_fields:
            out[field] = "honoured"
        elif field in VLLM_FIELDS_WITHOUT_EFFECT:
            out[field] = "no effect"
    return out


@pytest.mark.parametrize("kind", list(ENDPOINTS))
def test_every_vllm_field_is_honoured_or_refused_by_name(kind):
    fields = vllm_field_lists()[kind]
    groups = _groups(kind)
    undecided = [f for f in fields if f not in groups]
    assert not undecided, f"vLLM's {kind} fields neither honoured nor refused nor without effect here: {undecided}"
    counts = {g: sum(1 for v in groups.values() if v == g) for g in ("honoured", "refused", "no effect")}
    print(f"{kind}: {len(fields)} fields, {counts}")


def test_the_field_lists_name_their_vllm_commits():
    data = vllm_field_lists()
    assert len(data["completion"]) == 54 and len(data["chat"]) == 67  # CompletionRequest, ChatCompletionRequest
    for kind in ("completion", "chat", "tokenize_completion", "tokenize_chat"):
        assert len(data["sources"][kind]["commit"]) == 40


def test_every_message_field_goes_to_the_template_or_is_refused():
    decided = {*MESSAGE_FIELDS_TO_TEMPLATE, *MESSAGE_FIELDS_REFUSED, "reasoning_content"}  # the older reasoning
    undecided = [f for f in vllm_field_lists()["message"] if f not in decided]
    assert not undecided


@pytest.fixture(scope="module")
def server(real_model, tokenizer):
    with running_server(make_engine(real_model, tokenizer)) as server:
        yield server


def _cases(group: str) -> list[tuple[str, str]]:
    return [(kind, field) for kind in ENDPOINTS for field, g in _groups(kind).items() if g == group]


@pytest.mark.parametrize("kind,field", _cases("refused"))
def test_a_refused_field_that_asks_for_something_is_a_400_naming_it(server, kind, field):
    assert field in ASKING, f"give {field} a value that asks for something in ASKING"
    body = {**BASE[kind], field: ASKING[field]}
    if field == "prompt_embeds":
        body.pop("prompt")  # vLLM takes prompt_embeds instead of a prompt: the error must still name it
    response = httpx.post(server.url + ENDPOINTS[kind][1], json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field, response.text


@pytest.mark.parametrize("kind,field", _cases("no effect"))
def test_a_field_without_effect_is_accepted(server, kind, field):
    response = httpx.post(server.url + ENDPOINTS[kind][1], json={**BASE[kind], field: NO_EFFECT_VALUES[field]},
                          timeout=60)
    assert response.status_code == 200, response.text


def test_message_fields(server):
    url = server.url + "/v1/chat/completions"
    passed = {"role": "assistant", "content": "Hi", "name": "bot", "reasoning_content": "thinking",
              "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    tool = {"role": "tool", "content": "42", "tool_call_id": "c1"}
    messages = [{"role": "user", "content": "Hello", "name": "ann"}, passed, tool]
    assert httpx.post(url, json={"messages": messages, "max_tokens": 1}, timeout=60).status_code == 200
    for field, value in (("audio", {"id": "a"}), ("function_call", {"name": "f", "arguments": "{}"}),
                         ("refusal", "no"), ("tools", [{"type": "function", "function": {"name": "f"}}]),
                         ("task", "x")):
        response = httpx.post(url, json={"messages": [{"role": "user", "content": "Hi", field: value}]}, timeout=60)
        assert response.status_code == 400 and f"messages[0].{field}" in response.json()["error"]["message"]
