"""The second KV tier behind the server: usage and Prometheus series under vLLM's names (a server without a tier
exports none of them), and a `workbench serve --kv-offload disk` restarted on the same directory answering a
repeated long prompt from disk."""

from __future__ import annotations

import time

import httpx
import pytest
import torch
from serve_helpers import MODEL, on_engine, running_server

import workbench
from workbench.bench.server_counters import offload_delta, offload_line, scrape
from workbench.cache.tier.config import KVOffloadConfig
from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.monitoring.scrape import parse_exposition
from workbench.serve.launch import ServerProcess

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def complete(url: str, prompt, max_tokens: int = 2) -> tuple[float, dict]:
    start = time.perf_counter()
    response = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                                                         "temperature": 0}, timeout=300)
    response.raise_for_status()
    return time.perf_counter() - start, response.json()["usage"]


def series(url: str) -> dict[tuple[str, str], float]:
    rows = parse_exposition(httpx.get(f"{url}/metrics", timeout=30).text, 0.0)
    return {(name, labels): value for _, name, _, labels, value in rows}


def value(found: dict, name: str, **labels) -> float:
    return sum(v for (n, key), v in found.items() if n == name and all(f'{k}="{x}"' in key for k, x in labels.items()))


def test_restores_show_in_usage_and_under_vllms_metric_names(tokenizer):
    torch.manual_seed(0)
    model = workbench.random_model("smollm2-135m", num_layers=2, device="cpu")
    engine = LLMEngine(model, tokenizer, cache_config=CacheConfig(block_size=16, num_blocks=5),
                       scheduler_config=SchedulerConfig(max_num_seqs=1),
                       kv_offload=KVOffloadConfig("host", size_gib=0.05))
    first, second = list(range(1000, 1072)), list(range(2000, 2072))
    with running_server(engine) as server:
        before = scrape(server.url)
        complete(server.url, first)
        complete(server.url, second)  # a pool of 5 blocks evicts the first prompt's 4 full blocks: they spill
        _, usage = complete(server.url, first)
        found = series(server.url)
        delta = offload_delta(before, scrape(server.url))
        counters = on_engine(server, lambda e: (e.kv_offload.counters.store_bytes, e.kv_offload.counters.restore_bytes,
                                                e.kv_offload.counters.store_ops + e.kv_offload.counters.restore_ops))
    assert usage["prompt_tokens_details"]["cached_tokens"] == 64
    moved = value(found, "vllm:kv_offload_total_bytes_total", transfer_type="CPU_to_CPU")
    assert moved == counters[0] + counters[1] and counters[1] == 4 * engine.kv_offload.codec.bytes_per_block
    assert value(found, "vllm:external_prefix_cache_hits_total") == 64
    assert value(found, "vllm:prompt_tokens_cached_by_source_total", source="host") == 64
    assert value(found, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 64
    assert value(found, "vllm:kv_offload_size_count") == counters[2]
    assert (delta["tier_hits"], delta["CPU_to_CPU_bytes"]) == (64, moved)  # what `workbench bench` prints
    assert "second tier restored 64 of" in offload_line(delta)
    assert value(found, "vllm:cache_config_info", num_cpu_blocks=str(engine.kv_offload.store.num_slots)) == 1
    plain = LLMEngine(model, tokenizer, cache_config=CacheConfig(num_blocks=8))
    with running_server(plain) as server:
        assert not any("kv_offload" in name or "external_prefix" in name for name, _ in series(server.url))
        assert offload_delta(scrape(server.url), scrape(server.url)) is None  # no tier: no bench line


@pytest.mark.slow
def test_a_restarted_server_answers_a_repeated_long_prompt_from_disk(tmp_path):
    args = ["--kv-offload", "disk", "--kv-offload-dir", str(tmp_path), "--kv-offload-gib", "1",
            "--num-blocks", "96"]
    prompt = list(range(3000, 3600))  # 600 tokens: 37 full blocks
    with ServerProcess(args) as server:
        cold, usage = complete(server.url, prompt)
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert len(list(tmp_path.rglob("*.kvb"))) == 37  # write-through: every full block is on disk
    with ServerProcess(args) as server:
        warm, usage = complete(server.url, prompt)
        found = series(server.url)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 592
    assert value(found, "vllm:prompt_tokens_cached_by_source_total", source="disk") == 592
    assert value(found, "vllm:kv_offload_total_bytes_total", transfer_type="DISK_to_CPU") > 0
    assert warm < cold, (warm, cold)
