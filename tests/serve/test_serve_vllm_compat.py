"""Where this server behaves as vLLM's does (0.11): the chat stream's role arrives with the first token, vLLM's
request fields are honoured or refused by name (never dropped), ``null`` means the default, ``/detokenize`` and
``/version`` exist, and the metrics carry the ``engine`` label and vLLM's per-request series, with TTFT and ITL
observed while a request is still running."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from serve_helpers import MODEL, make_engine, running_server

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module")
def server(real_model, tokenizer):
    with running_server(make_engine(real_model, tokenizer)) as server:
        yield server


def _chat(server, **body) -> httpx.Response:
    return httpx.post(f"{server.url}{CHAT}", json={"model": MODEL, "messages": HELLO, "max_tokens": 2,
                                                   "temperature": 0, **body}, timeout=120)


def test_the_role_arrives_with_the_first_token(server):
    """The raw SSE transcript: nothing before the engine's first output, then the role chunk and the first token's
    chunk back to back (vLLM's bench serve times the first chunk as the first token)."""
    with httpx.stream("POST", f"{server.url}{CHAT}", json={"model": MODEL, "messages": HELLO, "max_tokens": 3,
                                                            "temperature": 0, "stream": True}, timeout=120) as r:
        arrivals = []
        for line in r.iter_lines():
            if line:
                arrivals.append((time.perf_counter(), line))
    lines = [line for _, line in arrivals]
    assert lines[0].startswith("data: ") and '"role":"assistant"' in lines[0], lines[:3]
    assert '"content":' in lines[1] and '"role"' not in lines[1], lines[:3]
    assert lines[-1] == "data: [DONE]"
    # The role and the first token leave the server together: well under the time a decode step takes here.
    assert arrivals[1][0] - arrivals[0][0] < 0.05, [t - arrivals[0][0] for t, _ in arrivals]


@pytest.mark.parametrize("field,value", [("logit_bias", {"5": 10.0}), ("stream_interval", 4),
                                         ("tools", [{"type": "function", "function": {"name": "f"}}]),
                                         ("response_format", {"type": "json_object"}), ("use_beam_search", True),
                                         ("guided_choice", ["a", "b"])])
def test_vllm_fields_the_engine_does_not_do_are_refused_by_name(server, field, value):
    response = _chat(server, **{field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and field in error["message"]


def test_neutral_values_nulls_and_unknown_fields_are_served(server):
    """What a client that fills in every field sends: neutral values of vLLM's fields, explicit nulls, and a
    field neither OpenAI nor vLLM knows (ignored, as both do)."""
    response = _chat(server, repetition_penalty=1.0, min_p=0.0, tools=None, skip_special_tokens=True, n=None,
                     stream=None, temperature=None, logprobs=None, ignore_eos=None, stop=None, some_new_option=7)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"


def test_detokenize_and_version(server):
    tokens = httpx.post(f"{server.url}/tokenize", json={"prompt": "Hello there"}).json()["tokens"]
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": tokens}).json() == {"prompt": "Hello there"}
    bad = httpx.post(f"{server.url}/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    version = httpx.get(f"{server.url}/version").json()["version"]
    assert version and isinstance(version, str)


def _series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name)]


def test_metrics_carry_vllms_labels_and_per_request_series(server):
    assert _chat(server, max_tokens=1).status_code == 200
    assert _chat(server, max_tokens=4).status_code == 200
    text = httpx.get(f"{server.url}/metrics").text
    running = _series(text, "vllm:num_requests_running{")
    assert running and 'engine="0"' in running[0] and f'model_name="{MODEL}"' in running[0]
    for name in ("vllm:request_prefill_time_seconds_count", "vllm:request_decode_time_seconds_count",
                 "vllm:request_inference_time_seconds_count", "vllm:request_max_num_generation_tokens_count",
                 "vllm:request_params_max_tokens_count", "vllm:request_params_n_count"):
        assert _series(text, name) and float(_series(text, name)[0].split()[-1]) >= 2, name
    assert _series(text, "vllm:prompt_tokens_cached_total")
    assert _series(text, 'vllm:num_requests_waiting_by_reason{')
    assert any('finished_reason="error"' in line for line in _series(text, "vllm:request_success_total"))
    assert _series(text, "vllm:cache_config_info{") and "block_size=" in _series(text, "vllm:cache_config_info{")[0]
    assert _series(text, "process_cpu_seconds_total")
    # TPOT is observed for every finished request, the one-token one included (as 0, as vLLM does).
    tpot = float(_series(text, "vllm:request_time_per_output_token_seconds_count")[0].split()[-1])
    e2e = float(_series(text, "vllm:e2e_request_latency_seconds_count")[0].split()[-1])
    assert tpot == e2e >= 2


def test_ttft_is_observed_while_the_request_is_still_running(server):
    """A long request's TTFT sample appears in /metrics before it finishes (vLLM observes it per step)."""
    def ttft_count() -> float:
        lines = _series(httpx.get(f"{server.url}/metrics").text, "vllm:time_to_first_token_seconds_count")
        return float(lines[0].split()[-1])

    before = ttft_count()
    with httpx.stream("POST", f"{server.url}{COMPLETIONS}", json={"model": MODEL, "prompt": "Once upon a time",
                                                                   "max_tokens": 40, "ignore_eos": True,
                                                                   "temperature": 0, "stream": True},
                      timeout=120) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: {"))  # the first token is out
        during = ttft_count()
        for _ in lines:
            pass
    assert during == before + 1


def _count(text: str, name: str) -> float:
    return float(_series(text, name)[0].split()[-1])


def test_n_and_the_longest_choice_are_observed_once_per_request(server):
    """vLLM observes ``request_params_n`` and ``request_max_num_generation_tokens`` once per request (when its
    last choice finishes, the longest choice), but its per-choice series (e2e, generation tokens) per choice."""
    names = ("vllm:request_params_n_count", "vllm:request_params_n_sum", "vllm:request_max_num_generation_tokens_sum",
             "vllm:request_max_num_generation_tokens_count", "vllm:e2e_request_latency_seconds_count")
    before = httpx.get(f"{server.url}/metrics").text
    response = _chat(server, n=3, max_tokens=6, temperature=1.0, seed=5, ignore_eos=True)  # 3 choices x 6 tokens
    assert response.status_code == 200, response.text
    after = httpx.get(f"{server.url}/metrics").text
    grew = {name: _count(after, name) - _count(before, name) for name in names}
    assert grew["vllm:request_params_n_count"] == 1 and grew["vllm:request_params_n_sum"] == 3, grew
    assert grew["vllm:request_max_num_generation_tokens_count"] == 1, grew
    assert grew["vllm:request_max_num_generation_tokens_sum"] == 6, grew  # per choice it would be 18
    assert grew["vllm:e2e_request_latency_seconds_count"] == 3, grew


def test_queue_time_counts_from_the_engine_queue_not_from_arrival(real_model, tokenizer):
    """A request that arrived long before the engine took it (time spent in a server's front end) has that time
    in its TTFT but not in its queue time, as in vLLM (whose queue clock starts in the engine core)."""
    from workbench.config import SamplingParams
    from workbench.serve.metrics import ServingMetrics

    engine = make_engine(real_model, tokenizer)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2), arrival_time=engine.clock() - 30.0)
    while engine.has_unfinished_requests():
        engine.step()
    metrics = ServingMetrics(MODEL, max_model_len=256)
    (seq,) = engine.metrics.finished
    metrics.record_progress(seq, 0)
    metrics.record_finished(seq)
    text = metrics.exposition().decode()
    assert _count(text, "vllm:time_to_first_token_seconds_sum") >= 30.0
    assert _count(text, "vllm:request_queue_time_seconds_count") == 1
    assert _count(text, "vllm:request_queue_time_seconds_sum") < 5.0


# ------------------------------------------------------------------------- fields honoured, not refused
SKY = [{"role": "user", "content": "Answer with one word: what color is the sky?"}]  # greedy: 10 tokens, then EOS


def test_sampling_extensions_are_honoured(server, real_model, tokenizer):
    """min_tokens, include_stop_str_in_output and the penalties change the answer the way the engine's own
    (transformers-checked, tests/engine/test_sampling_fields.py) sampling does."""
    from workbench.config import SamplingParams
    from workbench.engine.llm_engine import LLMEngine

    plain = _chat(server, messages=SKY, max_tokens=24).json()
    assert plain["choices"][0]["finish_reason"] == "stop" and plain["usage"]["completion_tokens"] < 14
    longer = _chat(server, messages=SKY, max_tokens=24, min_tokens=14).json()
    assert longer["usage"]["completion_tokens"] >= 14
    text = plain["choices"][0]["message"]["content"]
    word = text.split()[2]  # a word inside the answer, as a stop string
    cut = _chat(server, messages=SKY, max_tokens=24, stop=[word]).json()["choices"][0]["message"]["content"]
    kept = _chat(server, messages=SKY, max_tokens=24, stop=[word],
                 include_stop_str_in_output=True).json()["choices"][0]["message"]["content"]
    assert kept == cut + word and text.startswith(kept)
    body = {"repetition_penalty": 1.3, "frequency_penalty": 0.7, "presence_penalty": 0.4, "min_p": 0.05}
    served = _chat(server, messages=SKY, max_tokens=20, **body).json()["choices"][0]["message"]["content"]
    engine = LLMEngine(real_model, tokenizer)
    direct = engine.generate([SKY[0]["content"]], SamplingParams(max_tokens=20, **body), progress=False)[0].text
    assert served == direct and served != text


def test_chat_logprobs_whole_and_streamed(server):
    """OpenAI's chat logprobs: one entry per token whose texts make up the content, top alternatives best
    first with the greedy token on top; the streamed chunks carry the same entries."""
    whole = _chat(server, max_tokens=6, logprobs=True, top_logprobs=3).json()
    choice = whole["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == whole["usage"]["completion_tokens"]
    assert "".join(entry["token"] for entry in content) == choice["message"]["content"]
    for entry in content:
        top = entry["top_logprobs"]
        assert len(top) == 3 and [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert top[0]["token"] == entry["token"] and top[0]["logprob"] == pytest.approx(entry["logprob"])
        assert entry["logprob"] <= 0 and entry["bytes"] == list(entry["token"].encode())
    streamed = []
    with httpx.stream("POST", f"{server.url}{CHAT}", json={"model": MODEL, "messages": HELLO, "max_tokens": 6,
                                                            "temperature": 0, "stream": True, "logprobs": True,
                                                            "top_logprobs": 3}, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line.removeprefix("data: "))
                logprobs = chunk["choices"][0]["logprobs"] if chunk["choices"] else None
                streamed += logprobs["content"] if logprobs else []
    assert [e["token"] for e in streamed] == [e["token"] for e in content]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in content], abs=1e-5)


def test_completions_logprobs_and_the_openai_client(server):
    """Completions' logprobs are parallel lists with text offsets into the text; the openai client parses both
    endpoints' logprobs."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0,
                                     logprobs=2)
    logprobs = done.choices[0].logprobs
    assert "".join(logprobs.tokens) == done.choices[0].text and len(logprobs.tokens) == done.usage.completion_tokens
    assert logprobs.text_offset == [sum(map(len, logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert token in top and top[token] == pytest.approx(value) and len(top) <= 3
    chat = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3, temperature=0, logprobs=True)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens and content[0].top_logprobs == []


def test_top_logprobs_without_logprobs_is_refused(server):
    response = _chat(server, top_logprobs=2)
    assert response.status_code == 400 and response.json()["error"]["param"] == "top_logprobs"
    response = httpx.post(f"{server.url}{COMPLETIONS}", json={"model": MODEL, "prompt": "Hi", "logprobs": 21})
    assert response.status_code == 400 and response.json()["error"]["param"] == "logprobs"


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(server):
    """vLLM's ``stream_options.continuous_usage_stats`` (guidellm sends it): each chunk's usage counts the
    tokens streamed up to it, and the closing usage chunk agrees with the last of them."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", f"{server.url}{COMPLETIONS}", json=body, timeout=120) as r:
        chunks = [json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line.startswith("data: {")]
    with_text = [c for c in chunks if c["choices"]]
    counts = [c["usage"]["completion_tokens"] for c in with_text]
    assert counts == sorted(counts) and counts[-1] == 5 and counts[0] >= 1, counts
    assert {c["usage"]["prompt_tokens"] for c in with_text} == {chunks[-1]["usage"]["prompt_tokens"]}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
