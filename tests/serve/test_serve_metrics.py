"""/metrics parses with Prometheus' own text parser, carries vLLM's V1 names and buckets, and its counters
agree with the engine's own frames (here with speculative decoding on, so the spec counters move too)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import MODEL, make_engine, on_engine, running_server, wait_idle

from workbench.config import SpecConfig
from workbench.serve.metrics import TTFT_BUCKETS

# A prompt that repeats itself, so prompt lookup drafts tokens that get accepted.
REPEATING = "one two three four five six seven eight, one two three four five six seven eight, one two three"


@pytest.fixture(scope="module")
def server(real_model, tokenizer):
    engine = make_engine(real_model, tokenizer, spec_config=SpecConfig(method="ngram", num_speculative_tokens=3))
    with running_server(engine) as server:
        yield server


def _scrape(url: str) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted label items: value}} from the text exposition, through prometheus' parser."""
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _value(samples: dict, name: str, **labels) -> float:
    return samples[name][tuple(sorted({"model_name": MODEL, "engine": "0", **labels}.items()))]


async def _traffic(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        bodies = [{"model": MODEL, "prompt": REPEATING, "max_tokens": 24, "temperature": 0},
                  {"model": MODEL, "prompt": REPEATING, "max_tokens": 8, "temperature": 0},  # prefix-cache hit
                  {"model": MODEL, "prompt": "Name a colour.", "max_tokens": 6, "temperature": 0.7, "seed": 1,
                   "n": 2},
                  {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 5}]
        for body in bodies[:2]:
            assert (await client.post("/v1/completions", json=body)).status_code == 200
        replies = await asyncio.gather(client.post("/v1/completions", json=bodies[2]),
                                       client.post("/v1/chat/completions", json=bodies[3]))
        assert all(r.status_code == 200 for r in replies)
        async with client.stream("POST", "/v1/completions", json={**bodies[0], "max_tokens": 300,
                                                                  "ignore_eos": True, "stream": True}) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("data: {"):
                    break  # hang up after the first chunk: an aborted request


def test_metrics_parse_and_agree_with_engine_frames(server):
    asyncio.run(_traffic(server.url))
    wait_idle(server)
    samples = _scrape(server.url)
    frames = on_engine(server, lambda e: (e.metrics.request_frame(), e.metrics.itl_frame(), e.metrics.step_frame(),
                                          e.metrics.spec_counters(), e.blocks.stats))
    requests, itl, steps, spec, prefix = frames

    assert _value(samples, "vllm:generation_tokens_total") == requests["output_tokens"].sum()
    first_seqs = requests[requests["output_tokens"] > 0].drop_duplicates("request_id")
    assert _value(samples, "vllm:prompt_tokens_total") == first_seqs["prompt_tokens"].sum()
    # Each request's prompt, once, by where its KV came from; the repeated prompt found its prefix cached.
    cached = first_seqs["cached_prompt_tokens"]
    assert _value(samples, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == cached.sum() > 0
    assert (_value(samples, "vllm:prompt_tokens_by_source_total", source="local_compute")
            == (first_seqs["prompt_tokens"] - cached).sum() > 0)
    assert _value(samples, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    # Per finished request, the prompt tokens prefill computed; the prefix-cache hits come from the KV pool.
    computed = requests["prompt_tokens"] - requests["cached_prompt_tokens"]
    assert _value(samples, "vllm:request_prefill_kv_computed_tokens_count") == len(requests)
    assert _value(samples, "vllm:request_prefill_kv_computed_tokens_sum") == computed.sum() < requests[
        "prompt_tokens"].sum()
    for reason in ("stop", "length", "abort"):
        expected = int((requests["finish_reason"] == reason).sum())
        assert _value(samples, "vllm:request_success_total", finished_reason=reason) == expected
    assert _value(samples, "vllm:request_success_total", finished_reason="abort") == 1
    assert _value(samples, "vllm:e2e_request_latency_seconds_count") == len(requests)
    assert _value(samples, "vllm:e2e_request_latency_seconds_sum") == pytest.approx(requests["e2e_s"].sum())
    assert _value(samples, "vllm:time_to_first_token_seconds_count") == requests["ttft_s"].notna().sum()
    assert _value(samples, "vllm:time_to_first_token_seconds_sum") == pytest.approx(requests["ttft_s"].sum())
    # ITL: one sample per engine step that gave a sequence tokens after its first (as vLLM records it), so the
    # tokens a speculative step accepts together (zero gaps in the engine's per-token frame) are one sample.
    per_step = itl[itl["itl_s"] > 0]
    assert _value(samples, "vllm:inter_token_latency_seconds_count") == len(per_step) < len(itl)
    assert _value(samples, "vllm:inter_token_latency_seconds_sum") == pytest.approx(itl["itl_s"].sum())
    # TPOT: every finished request that produced a token, one-token requests included.
    assert _value(samples, "vllm:request_time_per_output_token_seconds_count") == requests["ttft_s"].notna().sum()
    assert _value(samples, "vllm:request_queue_time_seconds_count") == requests["queue_time_s"].notna().sum()
    assert _value(samples, "vllm:num_preemptions_total") == steps["preemptions"].sum()
    assert _value(samples, "vllm:iteration_tokens_total_count") == len(steps)
    assert _value(samples, "vllm:prefix_cache_queries_total") == prefix.queried_tokens
    assert _value(samples, "vllm:prefix_cache_hits_total") == prefix.hit_tokens > 0
    assert _value(samples, "vllm:prompt_tokens_cached_by_source_total", source="device") == prefix.hit_tokens
    for tier in ("host", "p2p", "disk", "external_unspecified"):
        assert _value(samples, "vllm:prompt_tokens_cached_by_source_total", source=tier) == 0
    assert [_value(samples, "vllm:engine_sleep_state", sleep_state=state)
            for state in ("awake", "weights_offloaded", "discard_all")] == [1, 0, 0]
    assert {dict(labels).get("engine") for labels in samples["vllm:cache_config_info"]} == {"0"}
    assert _value(samples, "vllm:spec_decode_num_drafts_total") == spec.passes > 0
    assert _value(samples, "vllm:spec_decode_num_draft_tokens_total") == spec.drafted
    assert _value(samples, "vllm:spec_decode_num_accepted_tokens_total") == spec.accepted > 0
    for position, accepted in enumerate(spec.accepted_at):
        assert _value(samples, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                      position=str(position)) == accepted
    assert _value(samples, "vllm:num_requests_running") == 0
    assert _value(samples, "vllm:num_requests_waiting") == 0
    assert _value(samples, "vllm:kv_cache_usage_perc") == 0.0

    ttft_bounds = sorted(float(dict(labels)["le"]) for labels in samples["vllm:time_to_first_token_seconds_bucket"])
    assert ttft_bounds == [*TTFT_BUCKETS, float("inf")]


def test_gauges_move_while_requests_run(server):
    async def scrape_while_running() -> list[dict]:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
            body = {"model": MODEL, "prompt": "Tell a story.", "max_tokens": 40, "ignore_eos": True,
                    "temperature": 0}
            running = [asyncio.create_task(client.post("/v1/completions", json=body)) for _ in range(3)]
            seen = []
            while not all(task.done() for task in running):
                seen.append(_scrape(server.url))
                await asyncio.sleep(0.2)
            await asyncio.gather(*running)
            return seen

    seen = asyncio.run(scrape_while_running())
    assert max(_value(s, "vllm:num_requests_running") for s in seen) >= 1
    assert max(_value(s, "vllm:kv_cache_usage_perc") for s in seen) > 0
