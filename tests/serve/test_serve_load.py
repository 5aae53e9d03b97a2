"""64 concurrent streaming clients: every request completes with its exact token count, none is lost or
duplicated, 10 clients that hang up mid-stream get their requests aborted and their KV blocks freed, and
/health answers throughout."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from serve_helpers import MODEL, make_engine, on_engine, running_server, wait_idle

from workbench.serve.generation import response_id_of
from workbench.workloads import mixed_lengths

NUM_CLIENTS = 64
NUM_DISCONNECTS = 10
DISCONNECT_AFTER_CHUNKS = 2
ABANDONED_MAX_TOKENS = 400  # far more than it gets before hanging up, so it is surely mid-stream


@pytest.fixture(scope="module")
def server(real_model, tokenizer):
    with running_server(make_engine(real_model, tokenizer)) as server:
        yield server


async def _stream(client: httpx.AsyncClient, body: dict, hang_up_after: int | None) -> dict:
    """Read one streamed completion; with ``hang_up_after``, close the connection after that many chunks."""
    text, request_id, usage, chunks, done = "", None, None, 0, False
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            payload = json.loads(data)
            request_id = request_id or payload["id"]
            usage = payload.get("usage") or usage
            for choice in payload["choices"]:
                text += choice["text"]
                chunks += 1
            if hang_up_after is not None and chunks >= hang_up_after:
                break  # leaving the block closes the connection mid-stream
    return {"id": request_id, "text": text, "usage": usage, "done": done, "chunks": chunks}


async def _poll_health(base_url: str, stop: asyncio.Event) -> list[tuple[int, float]]:
    results = []
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        while not stop.is_set():
            start = time.perf_counter()
            status = (await client.get("/health")).status_code
            results.append((status, time.perf_counter() - start))
            await asyncio.sleep(0.1)
    return results


async def _run_clients(base_url: str, bodies: list[dict], hang_ups: list[int | None]):
    stop = asyncio.Event()
    health = asyncio.create_task(_poll_health(base_url, stop))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as client:
        replies = await asyncio.gather(*[_stream(client, body, hang_up)
                                         for body, hang_up in zip(bodies, hang_ups, strict=True)])
    stop.set()
    return replies, await health


def test_64_streaming_clients_with_disconnects(server, tokenizer):
    workload = mixed_lengths(NUM_CLIENTS, prompt_tokens=(4, 48), output_tokens=(2, 24), seed=3)
    hang_ups: list[int | None] = [None] * NUM_CLIENTS
    for index in range(0, NUM_CLIENTS, NUM_CLIENTS // NUM_DISCONNECTS)[:NUM_DISCONNECTS]:
        hang_ups[index] = DISCONNECT_AFTER_CHUNKS
    bodies = [{"model": MODEL, "prompt": r.prompt, "temperature": 0, "ignore_eos": True, "stream": True,
               "stream_options": {"include_usage": True},
               "max_tokens": ABANDONED_MAX_TOKENS if hang_up else r.max_tokens}
              for r, hang_up in zip(workload, hang_ups, strict=True)]

    replies, health = asyncio.run(_run_clients(server.url, bodies, hang_ups))
    wait_idle(server)

    finished = on_engine(server, lambda engine: engine.metrics.request_frame())
    finished["request_id"] = finished["request_id"].map(response_id_of)
    outputs = on_engine(server, lambda engine: {response_id_of(s.request_id): list(s.output_ids)
                                                for s in engine.metrics.finished})
    assert len(set(r["id"] for r in replies)) == NUM_CLIENTS
    assert finished["request_id"].is_unique and set(finished["request_id"]) == {r["id"] for r in replies}
    by_id = finished.set_index("request_id")
    for body, hang_up, reply in zip(bodies, hang_ups, replies, strict=True):
        row = by_id.loc[reply["id"]]
        if hang_up is None:
            assert reply["done"] and reply["usage"]["completion_tokens"] == body["max_tokens"]
            assert row["finish_reason"] == "length" and row["output_tokens"] == body["max_tokens"]
            # Nothing lost or duplicated: the streamed text is the decode of every generated token.
            assert reply["text"] == tokenizer.decode(outputs[reply["id"]], skip_special_tokens=True)
        else:
            assert not reply["done"]
            assert row["finish_reason"] == "abort"
            assert DISCONNECT_AFTER_CHUNKS <= row["output_tokens"] < ABANDONED_MAX_TOKENS

    free, total = on_engine(server, lambda engine: (engine.blocks.num_free_blocks, engine.blocks.num_blocks))
    assert free == total, "blocks still held after every request finished or was aborted"
    assert len(health) >= 5 and all(status == 200 for status, _ in health)
    assert max(seconds for _, seconds in health) < 10.0


def test_client_gone_from_a_whole_response_aborts_it(server):
    before = on_engine(server, lambda engine: len(engine.metrics.finished))
    body = {"model": MODEL, "prompt": "Tell a long story.", "max_tokens": ABANDONED_MAX_TOKENS, "ignore_eos": True,
            "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up long before 400 tokens are ready
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=2.0)
    wait_idle(server)
    new = on_engine(server, lambda engine: engine.metrics.request_frame().iloc[before:])
    assert list(new["finish_reason"]) == ["abort"]
    assert new["output_tokens"].iloc[0] < ABANDONED_MAX_TOKENS
    free, total = on_engine(server, lambda engine: (engine.blocks.num_free_blocks, engine.blocks.num_blocks))
    assert free == total
