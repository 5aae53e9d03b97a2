"""Helpers for the server and benchmark-client tests: an engine on the session's real model, a server on
127.0.0.1 with a free port that always shuts down, and a reader for server-sent events."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from prometheus_client.parser import text_string_to_metric_families

from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.serve.launch import ServerThread

# 512 blocks of 16 tokens: 8k tokens of KV (~380 MB in fp32), far more than any test here holds at once.
TEST_NUM_BLOCKS = 512
MODEL = "smollm2-135m"


def make_engine(real_model, tokenizer, *, num_blocks: int = TEST_NUM_BLOCKS, **configs) -> LLMEngine:
    configs.setdefault("scheduler_config", SchedulerConfig())
    return LLMEngine(real_model, tokenizer, cache_config=CacheConfig(num_blocks=num_blocks), **configs)


@contextmanager
def running_server(engine: LLMEngine, **options) -> Iterator[ServerThread]:
    server = ServerThread(engine, model_name=MODEL, **options)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def sse_payloads(response: httpx.Response) -> list[dict | str]:
    """The ``data:`` payloads of a streamed response: dicts, and the final "[DONE]" string."""
    out: list[dict | str] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def on_engine(server: ServerThread, fn, timeout_s: float = 30.0):
    """Run ``fn(engine)`` on the server's engine thread (the only thread allowed to touch the engine)."""
    return server.engine_loop.call(fn).result(timeout_s)


def wait_idle(server: ServerThread, timeout_s: float = 60.0) -> None:
    """Until the engine has no unfinished request (aborts from disconnects arrive asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while on_engine(server, lambda engine: engine.has_unfinished_requests()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the engine still has unfinished requests after {timeout_s} s")
        time.sleep(0.05)


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of the server's /metrics: (sample name, labels, value)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def metric_total(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(v for n, lab, v in samples if n == name and labels.items() <= lab.items())


IDLE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def wait_metrics_idle(url: str, timeout_s: float = 15.0) -> dict[str, float]:
    """Until /metrics reads no request running or waiting and an idle KV cache (what a client sees, no engine
    access); AssertionError with the last readings if that does not happen in time."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(url)
        gauges = {name: metric_total(samples, name) for name in IDLE_GAUGES}
        if not any(gauges.values()):
            return gauges
        assert time.monotonic() < deadline, f"still busy {timeout_s} s later: {gauges}"
        time.sleep(0.1)
