"""Bad input gets its status and OpenAI's error shape naming the bad value, and the server keeps serving;
with an API key, a missing or wrong key gets 401 and the right one is served."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from serve_helpers import MODEL, make_engine, running_server

from workbench.serve.guards import exposure_warning

# A small pool (24 blocks of 16 = 384 tokens) so that a request can be too big for it yet fit the context.
POOL_BLOCKS = 24
MAX_BODY_BYTES = 256 * 1024
GOOD = {"model": MODEL, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def server(real_model, tokenizer):
    engine = make_engine(real_model, tokenizer, num_blocks=POOL_BLOCKS)
    with running_server(engine, max_body_bytes=MAX_BODY_BYTES) as server:
        yield server


def _completion(**changes) -> dict:
    return {**GOOD, **changes}


def _without(key: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != key}


# (name, path, JSON body or raw bytes, status, words the message must contain, param)
CASES = [
    ("prompt past the context", COMPLETIONS, _completion(prompt=[100] * 8200),
     400, ["maximum context length is 8192 tokens", "you requested 8201 tokens"], "prompt"),
    ("max_tokens past the context", COMPLETIONS, _completion(max_tokens=9000),
     400, ["maximum context length is 8192 tokens", "9000 max_tokens"], "max_tokens"),
    ("max_tokens zero", COMPLETIONS, _completion(max_tokens=0), 400, ["max_tokens must be >= 1 (0 only with echo"],
     "max_tokens"),
    ("max_tokens wrong type", COMPLETIONS, _completion(max_tokens="ten"), 400, ["max_tokens", "integer", "ten"],
     "max_tokens"),
    ("temperature too high", COMPLETIONS, _completion(temperature=2.5), 400, ["temperature must be in [0, 2], got 2.5"],
     "temperature"),
    ("temperature negative", CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                    "temperature": -1}, 400, ["temperature must be in [0, 2], got -1"], "temperature"),
    ("top_p zero", COMPLETIONS, _completion(top_p=0), 400, ["top_p must be in (0, 1], got 0"], "top_p"),
    ("top_p above one", COMPLETIONS, _completion(top_p=1.5), 400, ["top_p must be in (0, 1], got 1.5"], "top_p"),
    ("top_k below -1", COMPLETIONS, _completion(top_k=-2), 400, ["top_k must be >= -1, got -2"], "top_k"),
    ("n zero", COMPLETIONS, _completion(n=0), 400, ["n must be >= 1, got 0"], "n"),
    ("n above max_num_seqs", COMPLETIONS, _completion(n=500), 400, ["n must be in [1, 32]", "500"], "n"),
    ("empty messages", CHAT, {"model": MODEL, "messages": []}, 400, ["messages must be non-empty, got []"],
     "messages"),
    ("message without role", CHAT, {"model": MODEL, "messages": [{"content": "hi"}]}, 400, ["role"], "messages"),
    ("message with an unknown role", CHAT, {"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]},
     400, ["role", "robot"], "messages"),
    ("messages not a list", CHAT, {"model": MODEL, "messages": "hello"}, 400, ["messages"], "messages"),
    ("user message without content", CHAT, {"model": MODEL, "messages": [{"role": "user"}]}, 400,
     ["messages[0]", "no content"], "messages"),
    ("empty prompt", COMPLETIONS, _completion(prompt=""), 400, ["prompt must be non-empty"], "prompt"),
    ("missing prompt", COMPLETIONS, _without("prompt"), 400, ["prompt", "required"], "prompt"),
    ("token id outside the vocabulary", COMPLETIONS, _completion(prompt=[1, 999999]), 400,
     ["token id 999999", "outside the vocabulary"], "prompt"),
    ("never fits the KV pool", COMPLETIONS, _completion(prompt="word " * 100, max_tokens=600), 400,
     ["KV blocks", f"the whole cache has {POOL_BLOCKS}"], None),
    ("penalty out of range", COMPLETIONS, _completion(presence_penalty=2.5), 400, ["presence_penalty"],
     "presence_penalty"),
    ("unsupported logit bias", COMPLETIONS, _completion(logit_bias={"5": 1.0}), 400, ["logit_bias", "not supported"],
     "logit_bias"),
    ("too many logprobs", COMPLETIONS, _completion(logprobs=30), 400, ["logprobs"], "logprobs"),
    ("min_tokens above max_tokens", COMPLETIONS, _completion(min_tokens=9, max_tokens=4), 400, ["min_tokens"],
     "min_tokens"),
    ("unknown model", COMPLETIONS, _completion(model="gpt-9"), 404, ["'gpt-9' does not exist", MODEL], "model"),
    ("malformed JSON", COMPLETIONS, b'{"prompt": "hi", ', 400, ["not valid JSON"], None),
    ("JSON that is not an object", COMPLETIONS, b"[1, 2]", 400, ["body"], None),
    ("oversized body", COMPLETIONS, _completion(prompt="x" * (MAX_BODY_BYTES + 10)), 413,
     ["larger than the limit", str(MAX_BODY_BYTES)], None),
    ("unknown route", "/v1/embeddings", GOOD, 404, ["no route POST /v1/embeddings"], None),
    ("seed past int64", COMPLETIONS, _completion(seed=2**64, temperature=1), 400,
     ["seed must be in [-9223372036854775808, 9223372036854775807], got 18446744073709551616"], "seed"),
    ("seed below int64", COMPLETIONS, _completion(seed=-(2**64), temperature=1), 400, ["seed must be in ["], "seed"),
    ("chat past the context without max_tokens", CHAT, {"messages": [{"role": "user", "content": "hello " * 9000}]},
     400, ["maximum context length is 8192 tokens", "9031 tokens are in the messages alone"], "messages"),
    ("stop string empty", COMPLETIONS, _completion(stop=["x", ""]), 400, ["stop.1 must be non-empty"], "stop"),
    ("five stop strings", COMPLETIONS, _completion(stop=list("abcde")), 400, ["stop takes at most 4 items, got 5"],
     "stop"),
    ("whitespace prompt", COMPLETIONS, _completion(prompt="   "), 400, ["prompt must hold more than whitespace"],
     "prompt"),
    ("a batch past the limit", COMPLETIONS, _completion(prompt=["a"] * 65), 400, ["prompt takes at most 64 items"],
     "prompt"),
    ("too many sequences", COMPLETIONS, _completion(prompt=["a"] * 64, n=5), 400, ["asks for 320 sequences"],
     "prompt"),
]


@pytest.mark.parametrize(("path", "body", "status", "words", "param"), [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_bad_input_is_refused_and_server_keeps_serving(server, path, body, status, words, param):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        if isinstance(body, bytes):
            response = client.post(path, content=body, headers={"content-type": "application/json"})
        else:
            response = client.post(path, json=body)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"
        for word in words:
            assert word in error["message"], error["message"]
        assert error["param"] == param
        after = client.post(COMPLETIONS, json=GOOD)
        assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 1


def test_api_key_is_required_on_v1_routes(real_model, tokenizer):
    engine = make_engine(real_model, tokenizer, num_blocks=64)
    with running_server(engine, api_key="s3cret-key") as server, httpx.Client(base_url=server.url) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"},
                        {"Authorization": "Bearer s3cret-key-and-more"}):
            for method, path in (("post", COMPLETIONS), ("get", "/v1/models")):
                response = getattr(client, method)(path, json=GOOD, headers=headers) if method == "post" \
                    else client.get(path, headers=headers)
                assert response.status_code == 401, (headers, path)
                assert response.json()["error"]["code"] == "invalid_api_key"
        served = client.post(COMPLETIONS, json=GOOD, headers={"Authorization": "Bearer s3cret-key"})
        assert served.status_code == 200 and served.json()["choices"][0]["text"] is not None
        assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret-key"}).status_code == 200
        assert client.get("/health").status_code == 200  # as in vLLM, health and metrics stay open
        assert client.get("/metrics").status_code == 200


def test_exposure_warning_only_beyond_loopback_without_key():
    assert exposure_warning("127.0.0.1", None) is None
    assert exposure_warning("0.0.0.0", "key") is None
    warning = exposure_warning("0.0.0.0", None)
    assert warning is not None and "--api-key" in warning and "0.0.0.0" in warning


def test_integral_floats_are_integers(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        reply = client.post(COMPLETIONS, json=_completion(max_tokens=2.0, n=1.0, seed=7.0, temperature=1))
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
        refused = client.post(COMPLETIONS, json=_completion(max_tokens=2.5))
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize("headers", [{}, {"content-type": "application/x-www-form-urlencoded"},
                                     {"content-type": "text/plain"}])
def test_a_body_that_is_not_json_is_a_415_naming_the_content_type(server, headers):
    response = httpx.post(f"{server.url}{COMPLETIONS}", content=b'{"prompt": "hi", "max_tokens": 1}', headers=headers)
    assert response.status_code == 415, response.text
    message = response.json()["error"]["message"]
    assert "Content-Type: application/json" in message
    assert (headers.get("content-type") or "no Content-Type") in message


def test_messages_errors_use_anthropics_shape_and_ranges(server):
    body = {"model": "claude-haiku-4-5", "max_tokens": 2, "temperature": 1.5,
            "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{server.url}/v1/messages", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                          "message": "temperature must be in [0, 1], got 1.5"}}
    missing = httpx.post(f"{server.url}/v1/messages", json={**body, "model": "claude-nope", "temperature": 0})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_the_openapi_document_states_what_the_server_answers(server):
    doc = httpx.get(f"{server.url}/openapi.json").json()
    assert "422" not in json.dumps(doc["paths"]) and "HTTPValidationError" not in doc["components"]["schemas"]
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if method != "post":
                continue
            error = operation["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
            assert error.endswith("AnthropicErrorResponse" if path == "/v1/messages" else "/ErrorResponse")
            assert {"413", "415", "500"} <= set(operation["responses"])
    stream = doc["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]
    assert set(stream) == {"application/json", "text/event-stream"}
    schemas = doc["components"]["schemas"]
    request = schemas["CompletionRequest"]["properties"]
    assert request["n"]["maximum"] == 32 and request["prompt"]["anyOf"][1]["items"]["maximum"] == 49151
    seed = request["seed"]["anyOf"][0]
    assert (seed["minimum"], seed["maximum"]) == (-(2**63), 2**63 - 1)
    assert schemas["MessagesRequest"]["properties"]["temperature"]["maximum"] == 1
    assert "oneOf" in schemas["TokenizeRequest"]
    assert doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"].keys() == {"text/plain"}


def test_the_key_is_checked_first_and_where_vllm_checks_it(real_model, tokenizer):
    key = {"Authorization": "Bearer s3cret-key"}
    engine = make_engine(real_model, tokenizer, num_blocks=64)
    with running_server(engine, api_key="s3cret-key") as server, httpx.Client(base_url=server.url) as client:
        assert client.post(COMPLETIONS, content=b"{not json", headers={"content-type": "application/json"}
                           ).status_code == 401
        assert client.post("/v1/nope", json=GOOD).status_code == 401
        assert client.post("/hosted/openai/v1/chat/completions", json={}).status_code == 401
        assert client.post("/v1/nope", json=GOOD, headers=key).status_code == 404
        messages = {"model": "claude-haiku-4-5", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        refused = client.post("/v1/messages", json=messages)
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        assert client.post("/v1/messages", json=messages, headers={"x-api-key": "s3cret-key"}).status_code == 200
        assert client.post(COMPLETIONS, json=GOOD, headers={"x-api-key": "s3cret-key"}).status_code == 401
        # vLLM guards the paths under /v1 only: its tokenizer endpoints stay open, and so do these
        assert client.post("/tokenize", json={"prompt": "hi"}).status_code == 200
        assert client.post("/detokenize", json={"tokens": [1, 2]}).status_code == 200


def test_every_route_answers_503_while_draining(real_model, tokenizer):
    engine = make_engine(real_model, tokenizer, num_blocks=64)
    with running_server(engine) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        asyncio.run(server.engine_loop.drain(0.0))  # nothing runs: the drain only closes the door
        messages = client.post("/v1/messages", json={"model": "claude-haiku-4-5", "max_tokens": 1,
                                                     "messages": [{"role": "user", "content": "hi"}]})
        assert messages.status_code == 503, messages.text
        assert messages.json()["error"]["message"] == "the server is shutting down"
        hosted = client.post("/hosted/openai/v1/chat/completions", json={"messages": [{"role": "user",
                                                                                       "content": "hi"}]})
        assert hosted.status_code == 503 and hosted.json()["error"]["code"] == "service_unavailable"
        assert client.post(COMPLETIONS, json=GOOD).status_code == 503
        assert client.get("/health").status_code == 503  # a load balancer stops sending new work here
