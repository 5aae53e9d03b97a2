"""Hosted prompt caching through the real HTTP server: Anthropic's /v1/messages reports a cache write then
reads with a lower measured time to first token on the read, a prompt under the minimum reports none, a fifth
breakpoint is a 400, and the OpenAI emulation honours prompt_cache_key through the official client."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from serve_helpers import make_engine, running_server

from workbench.serve.anthropic_messages import ENGINE_CACHED_HEADER

MODEL = "claude-sonnet-4-5"  # minimum 1,024 tokens


def reference_text(rules: int) -> str:
    """A deterministic, varied 'system prompt' (~17 tokens a rule)."""
    return "\n".join(f"Rule {i}: orders from region {i % 7} with id {i * 7919 % 1000} ship from depot {i % 13}."
                     for i in range(rules))


@pytest.fixture(scope="module")
def server(real_model, tokenizer):
    with running_server(make_engine(real_model, tokenizer)) as running:
        yield running


def ask(server, system: str, question: str, **extra) -> tuple[dict, float, int]:
    body = {"model": MODEL, "max_tokens": 1, "temperature": 0,
            "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": question}], **extra}
    start = time.perf_counter()
    response = httpx.post(f"{server.url}/v1/messages", json=body, timeout=120)
    elapsed = time.perf_counter() - start
    assert response.status_code == 200, response.text
    return response.json(), elapsed, int(response.headers[ENGINE_CACHED_HEADER])


def test_long_prompt_writes_then_reads_faster(server):
    system = reference_text(80)
    first, first_s, first_engine = ask(server, system, "Which depot serves region 3?")
    second, second_s, second_engine = ask(server, system, "Which depot serves region 5?")
    u1, u2 = first["usage"], second["usage"]
    assert u1["cache_creation_input_tokens"] >= 1024 and u1["cache_read_input_tokens"] == 0
    assert u2["cache_read_input_tokens"] == u1["cache_creation_input_tokens"] and u2["cache_creation_input_tokens"] == 0
    total = u1["input_tokens"] + u1["cache_creation_input_tokens"] + u1["cache_read_input_tokens"]
    assert total == u2["input_tokens"] + u2["cache_read_input_tokens"]
    assert first_engine == 0 and second_engine >= 1024 - 16  # the engine really reused the prefix's blocks
    assert second_s < 0.6 * first_s, (first_s, second_s)  # max_tokens=1: the latency is the time to first token
    assert first["type"] == "message" and first["stop_reason"] == "max_tokens"


def test_prompt_under_minimum_reports_no_cache(server):
    system = reference_text(15)  # ~300 tokens, like the seed's example
    for _ in range(2):
        body, _, engine_cached = ask(server, system, "Which depot serves region 2?")
        usage = body["usage"]
        assert usage["cache_creation_input_tokens"] == 0 and usage["cache_read_input_tokens"] == 0
        assert 200 < usage["input_tokens"] < 1024
    assert engine_cached > 0  # the engine still reuses it: the minimum is a billing rule, not a physical one


def test_fifth_breakpoint_is_refused(server):
    blocks = [{"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}} for i in range(5)]
    response = httpx.post(f"{server.url}/v1/messages", timeout=60, json={
        "model": MODEL, "max_tokens": 1, "system": blocks, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 400
    assert "Found 5" in response.json()["error"]["message"]


def test_openai_emulation_with_prompt_cache_key(server):
    client = openai.OpenAI(base_url=f"{server.url}/hosted/openai/v1", api_key="unused")
    messages = [{"role": "system", "content": reference_text(75)}, {"role": "user", "content": "Region 4?"}]
    seen = []
    for key in ("tenant-a", "tenant-a", "tenant-b"):
        reply = client.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=1, temperature=0,
                                               extra_body={"prompt_cache_key": key})
        seen.append(reply.usage.prompt_tokens_details.cached_tokens)
    prompt_tokens = reply.usage.prompt_tokens
    assert prompt_tokens >= 1024
    assert seen[0] == 0 and seen[2] == 0  # a different key routes elsewhere
    assert seen[1] >= 1024 and (seen[1] - 1024) % 128 == 0 and prompt_tokens - seen[1] < 128
