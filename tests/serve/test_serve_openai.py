"""The server through the official ``openai`` client: the same greedy text as the offline engine, right usage
counts, prefix-cache hits reported as cached_tokens, n/stop/seed, and the service endpoints."""

from __future__ import annotations

import httpx
import openai
import pytest
from serve_helpers import MODEL, make_engine, on_engine, running_server

from workbench.config import SamplingParams

PROMPTS = ["The capital of France is", "Write one sentence about rivers."]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def server(real_model, tokenizer):
    with running_server(make_engine(real_model, tokenizer)) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def offline(real_model, tokenizer):
    """Greedy outputs of a separate offline engine on the same weights: raw text and through the chat template."""
    engine = make_engine(real_model, tokenizer, num_blocks=128)
    params = SamplingParams(max_tokens=MAX_TOKENS)
    return {chat: engine.generate(PROMPTS, params, chat=chat, progress=False) for chat in (False, True)}


def _streamed_text(stream, chat: bool) -> tuple[str, object]:
    text, usage = "", None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += (choice.delta.content or "") if chat else choice.text
    return text, usage


def test_completions_equal_offline_engine(client, offline):
    for prompt, expected in zip(PROMPTS, offline[False], strict=True):
        whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        assert whole.choices[0].text == expected.text
        assert whole.usage.prompt_tokens == len(expected.prompt_ids)
        assert whole.usage.completion_tokens == len(expected.token_ids)
        assert whole.usage.total_tokens == len(expected.prompt_ids) + len(expected.token_ids)
        assert whole.choices[0].finish_reason == expected.outputs[0].finish_reason
        stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                           stream=True, stream_options={"include_usage": True})
        text, usage = _streamed_text(stream, chat=False)
        assert text == expected.text
        assert usage.completion_tokens == len(expected.token_ids)
        assert usage.prompt_tokens_details.cached_tokens is not None


def test_chat_completions_equal_offline_engine(client, offline):
    for prompt, expected in zip(PROMPTS, offline[True], strict=True):
        messages = [{"role": "user", "content": prompt}]
        whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0)
        assert whole.choices[0].message.content == expected.text
        assert whole.choices[0].message.role == "assistant"
        assert whole.usage.prompt_tokens == len(expected.prompt_ids)
        assert whole.usage.completion_tokens == len(expected.token_ids)
        stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS,
                                                temperature=0, stream=True, stream_options={"include_usage": True})
        text, usage = _streamed_text(stream, chat=True)
        assert text == expected.text
        assert usage.prompt_tokens == len(expected.prompt_ids)


def test_repeated_long_prompt_reports_cached_tokens(client, server):
    prompt = " ".join(f"item {i} is on shelf {i % 7};" for i in range(60))  # ~600 tokens, unique to this test
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens > 500
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    block_size = on_engine(server, lambda engine: engine.cache_config.block_size)
    # Every full block but the one holding the last prompt token (which must be computed for its logits).
    assert cached == (first.usage.prompt_tokens - 1) // block_size * block_size
    assert second.choices[0].text == first.choices[0].text


def test_n_seed_and_stop(client):
    kwargs = dict(model=MODEL, prompt="List some fruits:", max_tokens=10, temperature=1.0, top_p=0.95, seed=7, n=3,
                  extra_body={"ignore_eos": True})
    first = client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    texts = [c.text for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.text for c in again.choices]  # a seed makes sampling reproducible
    assert len(set(texts)) > 1  # and the n completions are different draws
    assert first.usage.completion_tokens == 3 * 10  # usage counts every choice's tokens

    greedy = client.completions.create(model=MODEL, prompt="Count: one, two, three,", max_tokens=12, temperature=0)
    words = greedy.choices[0].text.split()
    stop = words[2]
    stopped = client.completions.create(model=MODEL, prompt="Count: one, two, three,", max_tokens=12, temperature=0,
                                        stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stop not in stopped.choices[0].text
    assert greedy.choices[0].text.startswith(stopped.choices[0].text)


def test_ignore_eos_generates_exactly_max_tokens(client):
    reply = client.completions.create(model=MODEL, prompt="Hi", max_tokens=20, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 20
    assert reply.choices[0].finish_reason == "length"


def test_models_tokenize_and_health(client, server, tokenizer):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server.url}/health").status_code == 200
    tokens = httpx.post(f"{server.url}/tokenize", json={"prompt": "Hello there"}).json()
    assert tokens["tokens"] == tokenizer("Hello there", add_special_tokens=False)["input_ids"]
    assert tokens["count"] == len(tokens["tokens"])
    assert tokens["max_model_len"] == 8192
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": [{"role": "user", "content": "Hello"}]}).json()
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}], add_generation_prompt=True,
                                         tokenize=False)
    assert chat["tokens"] == tokenizer(text, add_special_tokens=False)["input_ids"]
