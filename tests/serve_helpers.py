"""Helpers for the server and benchmark-client tests: an engine on the session's real model, a server on
127.0.0.1 with a free port that always shuts down, and a reader for server-sent events."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

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
