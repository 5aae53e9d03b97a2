"""The second KV tier under a CUDA cache (run in the GPU session; skipped without CUDA): blocks gathered on the device
and copied through pinned host memory, or to disk, and back, give the tokens of an engine that never evicted, with
CUDA graphs on; the start-up rule is measured on the device."""

from __future__ import annotations

import random

import pytest
import torch

import workbench
from workbench.cache.tier.config import KVOffloadConfig
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine

pytestmark = pytest.mark.gpu


def _sessions() -> list[list[int]]:
    rng = random.Random(0)
    history = [[rng.randrange(100, 40000) for _ in range(64)] for _ in range(4)]
    return [history[i % 4] + [rng.randrange(100, 40000) for _ in range(8)] for i in range(12)]


def _tokens(model, blocks: int, tier, kv_format: str) -> tuple[list, LLMEngine]:
    engine = LLMEngine(model, None, cache_config=CacheConfig(num_blocks=blocks, kv_cache_dtype=kv_format),
                       scheduler_config=SchedulerConfig(max_num_seqs=1), kv_offload=tier)
    out = [engine.generate([p], SamplingParams(max_tokens=6), progress=False, chat=False)[0].outputs[0].token_ids
           for p in _sessions()]
    return out, engine


@pytest.mark.parametrize("kind,kv_format", [("host", "auto"), ("host", "int4"), ("disk", "auto")])
def test_restores_on_cuda_give_the_tokens_of_an_engine_that_never_evicts(tmp_path, kind, kv_format):
    torch.manual_seed(0)
    model = workbench.random_model("smollm2-135m", num_layers=2, device="cuda", dtype=torch.bfloat16)
    reference, _ = _tokens(model, 256, None, kv_format)
    tier = KVOffloadConfig(kind, size_gib=0.1, directory=tmp_path if kind == "disk" else None)
    got, engine = _tokens(model, 8, tier, kv_format)
    assert got == reference and engine.kv_offload.counters.restored_blocks == 32
    if kind == "host":
        assert engine.kv_offload.store.rows.is_pinned()  # copies to and from the GPU by DMA
    assert engine.kv_offload.rule.restore.per_block_s > 0 and engine.kv_offload.transfer_types["restore"] in (
        "CPU_to_GPU", "DISK_to_GPU")
