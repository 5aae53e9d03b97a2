"""One bad request never harms another (the reliability review of 2026-11-25, its failures R1-R4 as tests):

- isolation: requests with extreme but legal sampling values (temperature 1e-300, top_p 5e-324,
  repetition_penalty 1e-38) beside healthy streams get a 200, and every healthy stream gets exactly the tokens it
  gets alone; a request whose next token still cannot be drawn ends alone with finish reason "error";
- disconnects: on every generation route, a client that leaves (streaming or waiting for a whole reply) gets its
  request aborted at once, and /v1/messages and the hosted route check the context like the OpenAI routes;
- text: a lone UTF-16 surrogate anywhere in a body is a 400 naming the field, and the keep-alive connection stays;
- blocking: a 3.9 MB /tokenize (and a 3.9 MB prompt refused for its length) no longer freezes running streams.

The isolation tests' server runs the real model in batch-invariant mode, so "the same tokens as alone" is exact by
construction; the others run it as served by default.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time

import httpx
import pytest
from serve_helpers import MODEL, make_engine, metric_total, running_server, scrape, wait_metrics_idle

from workbench.config import SamplingParams

POISONS = [{"temperature": 1e-300}, {"temperature": 1.0, "top_p": 5e-324},
           {"temperature": 1.0, "repetition_penalty": 1e-38}, {"temperature": 2.3e-53, "top_p": 1e-46}]
HEALTHY = [{"prompt": "Once upon a time", "temperature": 0},
           {"prompt": "The river", "temperature": 0.8, "seed": 11},
           {"prompt": "List three colors:", "temperature": 1.0, "top_p": 0.9, "seed": 3}]
TOKENS = 16


@pytest.fixture(scope="module")
def invariant_server(real_model, tokenizer):
    """For the isolation tests: each request's logits do not depend on what else is in its batch."""
    with running_server(make_engine(real_model, tokenizer, batch_invariant=True)) as server:
        yield server


@pytest.fixture(scope="module")
def server(real_model, tokenizer):
    with running_server(make_engine(real_model, tokenizer)) as server:
        yield server


def _stream(url: str, body: dict, out: list, first: threading.Event) -> None:
    """A streaming completion; its payloads go to ``out`` (``first`` is set at the first chunk)."""
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
                first.set()


def _text(payloads: list) -> str:
    return "".join(c["text"] for p in payloads if isinstance(p, dict) and "choices" in p for c in p["choices"])


def _healthy_body(spec: dict) -> dict:
    return {"model": MODEL, "max_tokens": TOKENS, "ignore_eos": True, "stream": True, **spec}


def _start_healthy(url: str) -> tuple[list[list], list[threading.Thread]]:
    outs, firsts = [[] for _ in HEALTHY], [threading.Event() for _ in HEALTHY]
    threads = [threading.Thread(target=_stream, args=(url, _healthy_body(spec), out, first))
               for spec, out, first in zip(HEALTHY, outs, firsts, strict=True)]
    for thread in threads:
        thread.start()
    assert all(first.wait(120) for first in firsts)
    return outs, threads


@pytest.fixture(scope="module")
def alone(invariant_server) -> list[str]:
    """The text of each healthy stream when it runs alone."""
    texts = []
    for spec in HEALTHY:
        out: list = []
        _stream(invariant_server.url, _healthy_body(spec), out, threading.Event())
        texts.append(_text(out))
    return texts


def test_extreme_sampling_values_are_served_and_harm_no_other_stream(invariant_server, alone):
    server = invariant_server
    outs, threads = _start_healthy(server.url)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for poison in POISONS:
            body = {"model": MODEL, "prompt": "x", "max_tokens": 2, **poison}
            assert client.post("/v1/completions", json=body).status_code == 200
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **poison}
            reply = client.post("/v1/chat/completions", json=chat)
            assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] in ("stop", "length")
        messages = {"model": "claude-haiku-4-5", "max_tokens": 2, "temperature": 1e-300,
                    "messages": [{"role": "user", "content": "hi"}]}
        assert client.post("/v1/messages", json=messages).status_code == 200
    for thread in threads:
        thread.join(300)
    for out, text in zip(outs, alone, strict=True):
        assert out[-1] == "[DONE]"
        assert [c["finish_reason"] for p in out[:-1] for c in p["choices"] if c["finish_reason"]] == ["length"]
        assert _text(out) == text
    assert metric_total(scrape(server.url), "vllm:request_success_total", finished_reason="error") == 0


async def _poisoned_request(server) -> list:
    """A request whose SamplingParams hold NaN (a value past every check), added through the engine loop; its events."""
    params = SamplingParams(max_tokens=8, temperature=1.0)
    object.__setattr__(params, "temperature", float("nan"))
    stream = await server.engine_loop.add_request(
        "poisoned", lambda engine: (engine.tokenizer("poison")["input_ids"], params), 1, time.perf_counter())
    return [event async for event in stream]


def test_a_request_whose_token_cannot_be_drawn_fails_alone(invariant_server, alone):
    server = invariant_server
    errors_before = metric_total(scrape(server.url), "vllm:request_success_total", finished_reason="error")
    outs, threads = _start_healthy(server.url)
    events = asyncio.run(_poisoned_request(server))
    for thread in threads:
        thread.join(300)
    last = events[-1]
    assert last.error is not None and "not a distribution" in last.error
    assert [d.finish_reason for e in events for d in e.choices if d.finish_reason] == ["error"]
    assert [_text(out) for out in outs] == alone
    assert all(out[-1] == "[DONE]" for out in outs)
    samples = scrape(server.url)
    assert metric_total(samples, "vllm:request_success_total", finished_reason="error") == errors_before + 1


# ------------------------------------------------------------------------------------------------- disconnects
LONG = 2000  # tokens: minutes on this CPU unless the request is aborted
ROUTES = [
    ("/v1/completions", {"model": MODEL, "prompt": "Write a long essay.", "max_tokens": LONG, "ignore_eos": True}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Write a long essay."}],
                              "max_tokens": LONG, "ignore_eos": True}),
    ("/v1/messages", {"model": "claude-haiku-4-5", "max_tokens": LONG, "temperature": 0,  # greedy: no early EOS
                      "messages": [{"role": "user", "content": "Repeat the word hello 1000 times."}]}),
    ("/hosted/openai/v1/chat/completions", {"model": "gpt-4o", "max_tokens": LONG, "ignore_eos": True,
                                            "messages": [{"role": "user", "content": "Write a long essay."}]}),
]


def _aborts(url: str) -> float:
    return metric_total(scrape(url), "vllm:request_success_total", finished_reason="abort")


def _running(url: str) -> float:
    return metric_total(scrape(url), "vllm:num_requests_running")


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[path for path, _ in ROUTES])
def test_a_client_that_leaves_a_whole_reply_aborts_its_request(server, path, body):
    aborts = _aborts(server.url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}{path}", json=body, timeout=httpx.Timeout(60, read=2.0))
    wait_metrics_idle(server.url, timeout_s=10)
    assert _aborts(server.url) == aborts + 1


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_client_that_leaves_a_stream_aborts_its_request(server, path):
    body = {**dict(ROUTES)[path], "stream": True}
    aborts = _aborts(server.url)
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=60) as response:
        chunks = 0
        for line in response.iter_lines():
            chunks += line.startswith("data: ")
            if chunks == 3:
                break
    wait_metrics_idle(server.url, timeout_s=10)
    assert _aborts(server.url) == aborts + 1


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[path for path, _ in ROUTES])
def test_every_route_checks_the_context(server, path, body):
    response = httpx.post(f"{server.url}{path}", json={**body, "max_tokens": 1_000_000}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "maximum context length is 8192 tokens" in error["message"] and "1000000 max_tokens" in error["message"]
    if path == "/v1/messages":
        assert response.json()["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        assert error["param"] == "max_tokens" and error["code"] == "context_length_exceeded"
    assert _running(server.url) == 0


# ------------------------------------------------------------------------------------------------ invalid text
SURROGATE = "\\ud800"  # in JSON source: a valid escape for a lone UTF-16 half, which is no character
TEXT_CASES = [
    ("/v1/completions", f'{{"model": "{MODEL}", "prompt": "hi {SURROGATE}", "max_tokens": 2}}', "prompt"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": "a{SURROGATE}"}}], "max_tokens": 2}}',
     "messages[0].content"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": [{{"type": "text", "text": '
                             f'"{SURROGATE}"}}]}}], "max_tokens": 2}}', "messages[0].content[0].text"),
    ("/v1/completions", f'{{"prompt": "hi", "max_tokens": 2, "stop": ["x", "{SURROGATE}"]}}', "stop[1]"),
    ("/v1/completions", f'{{"prompt": "hi", "max_tokens": 2, "model": "{SURROGATE}"}}', "model"),
    ("/tokenize", f'{{"prompt": "{SURROGATE}"}}', "prompt"),
    ("/tokenize", f'{{"messages": [{{"role": "user", "content": "{SURROGATE}"}}]}}', "messages[0].content"),
    ("/v1/messages", f'{{"model": "claude-haiku-4-5", "max_tokens": 2, "system": "{SURROGATE}", '
                     f'"messages": [{{"role": "user", "content": "hi"}}]}}', "system"),
    ("/hosted/openai/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": "{SURROGATE}"}}]}}',
     "messages[0].content"),
]


@pytest.mark.parametrize(("path", "raw", "field"), TEXT_CASES, ids=[f"{c[0]} {c[2]}" for c in TEXT_CASES])
def test_a_lone_surrogate_is_a_400_naming_the_field_and_the_connection_stays(server, path, raw, field):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        response = client.post(path, content=raw.encode(), headers={"content-type": "application/json"})
        assert response.status_code == 400, response.text
        assert response.headers.get("connection") != "close"
        body = response.json()
        message = body["error"]["message"]
        assert message.startswith(f"{field} is not valid Unicode text") and "U+D800" in message, message
        if path != "/v1/messages":
            assert body["error"]["param"] == field.split("[")[0]
        assert client.get("/health").status_code == 200
        assert client.post("/tokenize", json={"prompt": "fine"}).status_code == 200


# ---------------------------------------------------------------------------------------------------- blocking
def test_big_bodies_do_not_freeze_running_streams(server):
    """3.9 MB of text (~780k tokens, about 2 s to tokenize) to /tokenize and as a completion prompt (refused for its
    length after tokenizing) while a stream runs: it keeps its pace (it stopped for the whole tokenization before)."""
    big = {"prompt": "word " * 780_000}
    times: list[float] = []
    done = threading.Event()

    def follow() -> None:
        body = {"model": MODEL, "prompt": "Count:", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=300) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    times.append(time.perf_counter())
                if done.is_set():
                    break  # leaving aborts the stream

    follower = threading.Thread(target=follow)
    follower.start()
    deadline = time.monotonic() + 120
    while len(times) < 20:
        assert follower.is_alive() and time.monotonic() < deadline, "the stream did not start"
        time.sleep(0.01)
    windows = []
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for path, body, status in (("/tokenize", big, 200), ("/v1/completions", {**big, "max_tokens": 2}, 400)):
            start = time.perf_counter()
            response = client.post(path, json=body)
            windows.append((start, time.perf_counter()))
            assert response.status_code == status, response.text[:300]
    time.sleep(0.5)
    done.set()
    follower.join(300)
    wait_metrics_idle(server.url, timeout_s=10)
    gaps = [(b - a, a) for a, b in zip(times, times[1:], strict=False)]
    typical = statistics.median(g for g, _ in gaps)
    for start, end in windows:
        during = [g for g, at in gaps if start <= at <= end]
        print(f"{end - start:.2f} s request: {len(during)} chunks meanwhile, longest gap {max(during):.3f} s, "
              f"typical {typical:.3f} s")
        assert end - start > 0.5  # the body really was big work
        assert len(during) >= 3 and max(during) < 0.6 * (end - start)
