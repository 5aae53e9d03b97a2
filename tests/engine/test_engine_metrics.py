"""Per-request and per-step metrics, the workload runner, and the engine's input checks."""

from __future__ import annotations

import pytest

from workbench.bench import run_workload
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.workloads import (
    WorkloadRequest,
    load_workload,
    long_prompt_among_decoders,
    mixed_lengths,
    shared_system_prompt,
    with_arrivals,
)


@pytest.fixture
def engine(real_model, tokenizer):
    engine = LLMEngine(real_model, tokenizer, cache_config=CacheConfig(num_blocks=128),
                       scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128))
    yield engine
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def test_request_and_step_frames(engine):
    workload = mixed_lengths(6, prompt_tokens=(8, 64), output_tokens=(4, 16), seed=3)
    result = run_workload(engine, workload, realtime=False, progress=False)
    req = result.requests
    assert len(req) == 6 and (req["output_tokens"] == [r.max_tokens for r in workload]).all()
    assert (req["queue_time_s"] >= 0).all() and (req["ttft_s"] > 0).all()
    assert (req["ttft_s"] <= req["e2e_s"]).all() and (req["finish_reason"] == "length").all()
    assert len(result.itl) == int((req["output_tokens"] - 1).sum()) and (result.itl["itl_s"] > 0).all()
    steps = result.steps
    assert steps["num_prefill_tokens"].sum() == sum(len(r.prompt) for r in workload)
    assert steps["num_decode_tokens"].sum() == int((req["output_tokens"] - 1).sum())
    assert (steps["batch_size"] <= 4).all() and (steps["tokens"] <= 128).all()
    assert (steps["kv_blocks_used"] + steps["kv_blocks_free"] == 128).all()
    assert set(result.summary.index) == {"ttft_ms", "itl_ms", "tpot_ms", "queue_ms", "e2e_ms"}
    assert list(result.summary.columns) == ["p50", "p95", "p99", "mean"]
    assert result.throughput["output_tokens"] == int(req["output_tokens"].sum())


def test_realtime_arrivals_are_respected(engine):
    workload = with_arrivals(mixed_lengths(3, prompt_tokens=(8, 16), output_tokens=(4, 4)), rate_per_s=20, seed=1)
    result = run_workload(engine, workload, realtime=True, progress=False)
    arrivals = (result.requests["arrival"] - result.requests["arrival"].min()).round(6).tolist()
    assert arrivals == pytest.approx([r.arrival_s for r in workload], abs=1e-6)
    assert (result.requests["first_scheduled"] >= result.requests["arrival"]).all()


def test_prefix_hit_tokens_are_counted_per_step(engine):
    workload = shared_system_prompt(3, "You are a careful assistant who answers briefly. " * 6, max_tokens=2)
    run_workload(engine, workload[:1], realtime=False, progress=False)
    result = run_workload(engine, workload[1:], realtime=False, progress=False)
    assert result.steps["prefix_hit_tokens"].sum() == result.requests["cached_prompt_tokens"].sum() > 0


def test_workload_files_load():
    for name in ("shared_system_prompt_chat", "mixed_short_long", "long_prompts"):
        workload = load_workload(name)
        assert workload and all(isinstance(r, WorkloadRequest) for r in workload)
    with pytest.raises(ValueError, match="unknown workload"):
        load_workload("nope")
    assert long_prompt_among_decoders(2)[-1].tags["role"] == "long_prompt"


@pytest.mark.parametrize("kwargs,match", [
    ({"prompt": ""}, "non-empty"),
    ({"prompt": [10**6]}, "outside the vocabulary"),
    ({"prompt": "hi", "params": "greedy"}, "SamplingParams"),
    ({"prompt": "hi", "params": SamplingParams(max_tokens=4000)}, "KV blocks"),  # fits the context, not the pool
    ({"prompt": "hi", "params": SamplingParams(max_tokens=100_000)}, "maximum context length is 8192 tokens"),
    ({"prompt": [5] * 8192}, "maximum context length is 8192 tokens"),
])
def test_bad_requests_are_refused_and_others_keep_running(engine, kwargs, match):
    good = engine.add_request("Say hello.", SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match=match):
        engine.add_request(kwargs["prompt"], kwargs.get("params"))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.metrics.request_frame()["request_id"].tolist() == [good]


def test_duplicate_and_unknown_request_ids(engine):
    engine.add_request("Hi.", SamplingParams(max_tokens=2), request_id="a")
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("Hi.", request_id="a")
    with pytest.raises(ValueError, match="unknown request id"):
        engine.abort("zzz")
    engine.abort("a")


def test_without_chunking_a_too_long_sequence_is_refused(real_model, tokenizer):
    engine = LLMEngine(real_model, tokenizer, cache_config=CacheConfig(num_blocks=64),
                       scheduler_config=SchedulerConfig(enable_chunked_prefill=False, max_num_batched_tokens=64,
                                                        max_num_seqs=4))
    with pytest.raises(ValueError, match="chunked prefill"):
        engine.add_request([5] * 60, SamplingParams(max_tokens=10))


@pytest.mark.parametrize("kwargs,match", [
    ({"block_size": 0}, "block_size"), ({"num_blocks": 0}, "num_blocks"), ({"kv_cache_dtype": "int3"}, "int8"),
    ({"memory_utilization": 0}, "memory_utilization"),
])
def test_bad_cache_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CacheConfig(**kwargs)


@pytest.mark.parametrize("kwargs,match", [
    ({"max_num_seqs": 0}, "max_num_seqs"), ({"max_num_batched_tokens": 4, "max_num_seqs": 8}, "max_num_batched"),
    ({"batching": "eager"}, "batching"), ({"max_prefill_chunk": 0}, "max_prefill_chunk"),
])
def test_bad_scheduler_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(**kwargs)
