"""Contiguous vs paged reservations: hand-checked numbers, and the measured timeline of a real run."""

from __future__ import annotations

import pytest

from workbench.bench import run_workload
from workbench.cache.memory_compare import compare_reservations, measured_timeline
from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.workloads import mixed_lengths


def test_reservations_by_hand():
    frame = compare_reservations([(10, 5), (40, 24)], bytes_per_token=100, max_len=128, block_size=16)
    assert frame["used_bytes"].tolist() == [1500, 6400]
    assert frame["paged_bytes"].tolist() == [1600, 6400]  # 15 tokens -> 1 block; 64 tokens -> 4 blocks
    assert frame["contiguous_bytes"].tolist() == [12800, 12800]
    totals = frame.attrs["totals"]
    assert totals["saving"] == pytest.approx(1 - 8000 / 25600)
    assert totals["paged_waste"] == pytest.approx(1 - 7900 / 8000)
    with pytest.raises(ValueError, match="does not fit"):
        compare_reservations([(100, 100)], bytes_per_token=1, max_len=128)


def test_measured_timeline_matches_the_engine(real_model, tokenizer):
    engine = LLMEngine(real_model, tokenizer, cache_config=CacheConfig(num_blocks=64, block_size=16),
                       scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128))
    result = run_workload(engine, mixed_lengths(4, prompt_tokens=(8, 40), output_tokens=(2, 12), seed=5),
                          realtime=False, progress=False)
    timeline = measured_timeline(result.steps, bytes_per_block=engine.cache.bytes_per_block, block_size=16,
                                 max_len=512)
    assert len(timeline) == len(result.steps)
    assert (timeline["paged_bytes"] <= timeline["contiguous_bytes"]).all()
    assert timeline["paged_bytes"].max() > 0 and (timeline["saving"].dropna() > 0.5).all()
    assert engine.cache.bytes_per_block == 2 * 30 * 16 * 3 * 64 * 4
