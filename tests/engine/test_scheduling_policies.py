"""Priority scheduling and cache-aware admission on tiny KV pools, through the real engine.

A one-layer random-weight model with SmolLM2's attention shapes keeps each step at a few milliseconds; token
values are meaningless, only who is admitted, who is preempted and what the block manager holds matter. Every
test ends with the pool fully released (no block leaked) and the block manager's invariants intact.
"""

from __future__ import annotations

from collections import deque
from functools import cache

import pytest
from tiny_models import SMALL, tiny_model

from workbench.cache.block_invariants import check_block_manager
from workbench.cache.block_manager import BlockManager
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.admission_policy import AdmissionPolicy
from workbench.engine.llm_engine import LLMEngine
from workbench.engine.sequence import Sequence

BLOCK = 4


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: see tests/conftest.py


@cache
def small_model():
    return tiny_model(seed=1, num_layers=1, **SMALL)


def engine(num_blocks: int, max_num_seqs: int, **policy) -> LLMEngine:
    return LLMEngine(small_model(), cache_config=CacheConfig(block_size=BLOCK, num_blocks=num_blocks),
                     scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=64,
                                                      **policy))


def run_to_end(eng: LLMEngine) -> None:
    for _ in range(2000):  # bounded: these workloads need well under a few hundred steps
        if not eng.has_unfinished_requests():
            break
        eng.step()
        check_block_manager(eng.blocks)
    assert not eng.has_unfinished_requests()
    assert eng.blocks.num_used_blocks == 0, "a block is still held after every request finished"
    check_block_manager(eng.blocks)


def params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


def admission_order(policy: str) -> list[str]:
    eng = engine(num_blocks=32, max_num_seqs=1, scheduling_policy=policy)
    for rid, priority in (("a", 2), ("b", 0), ("c", 1), ("d", 0)):
        eng.add_request([10 + len(rid), 11, 12], params(3), request_id=rid, arrival_time=0.0, priority=priority)
    run_to_end(eng)
    frame = eng.metrics.request_frame().sort_values("first_scheduled")
    return list(frame["request_id"])


def test_priority_policy_admits_lowest_value_first_and_fcfs_ignores_priority():
    assert admission_order("priority") == ["b", "d", "c", "a"]  # ties (b, d) keep arrival order
    assert admission_order("fcfs") == ["a", "b", "c", "d"]


def preemptions(policy: str) -> dict[str, int]:
    # 3 sequences of up to 4 + 12 tokens = 4 blocks each, in 9 blocks: someone must give way while decoding.
    eng = engine(num_blocks=9, max_num_seqs=3, scheduling_policy=policy)
    for index, (rid, priority) in enumerate((("background", 5), ("urgent-1", 0), ("urgent-2", 0))):
        eng.add_request([20 + index, 21, 22, 23], params(12), request_id=rid, arrival_time=float(index),
                        priority=priority)
    run_to_end(eng)
    frame = eng.metrics.request_frame()
    return dict(zip(frame["request_id"], frame["preemptions"], strict=True))


def test_priority_policy_preempts_the_lowest_priority_running_request_first():
    by_priority = preemptions("priority")
    assert by_priority["background"] >= 1
    assert by_priority["urgent-1"] == by_priority["urgent-2"] == 0
    fcfs = preemptions("fcfs")  # the same pool under FCFS preempts the newest: an urgent one
    assert fcfs["urgent-2"] >= 1 and fcfs["background"] == 0


def test_victim_choice_skips_scheduled_sequences_and_breaks_ties_by_latest_arrival():
    def seq(seq_id: int, priority: int, arrival: float) -> Sequence:
        s = Sequence(seq_id, f"r{seq_id}", [1, 2], SamplingParams(), 8, arrival)
        s.priority = priority
        return s

    running = [seq(0, 1, 0.0), seq(1, 3, 1.0), seq(2, 3, 2.0), seq(3, 0, 3.0)]
    policy = AdmissionPolicy(SchedulerConfig(scheduling_policy="priority"))
    assert policy.victim(running, set()).seq_id == 2
    assert policy.victim(running, {2}).seq_id == 1
    assert policy.victim(running, {1, 2}).seq_id == 0
    assert AdmissionPolicy(SchedulerConfig()).victim(running, {3}).seq_id == 2
    with pytest.raises(ValueError, match="no running sequence"):
        policy.victim(running, {0, 1, 2, 3})


def test_cache_aware_order_puts_cached_prefixes_first_among_equal_priority():
    blocks = BlockManager(16, BLOCK)
    shared = list(range(1, 9))  # two full blocks, computed and cached by a first sequence
    blocks.add_sequence(99, shared + [50])
    blocks.reserve(99, 9)
    blocks.mark_computed(99, 9)
    blocks.free(99)
    cold = Sequence(0, "cold", [70, 71, 72, 73, 74], SamplingParams(), 16, 0.0)
    warm = Sequence(1, "warm", shared + [60], SamplingParams(), 16, 1.0)
    waiting = deque([cold, warm])
    AdmissionPolicy(SchedulerConfig()).order_waiting(waiting, blocks)
    assert [s.request_id for s in waiting] == ["cold", "warm"]  # off by default
    AdmissionPolicy(SchedulerConfig(cache_aware_admission=True)).order_waiting(waiting, blocks)
    assert [s.request_id for s in waiting] == ["warm", "cold"]


def hit_rate(cache_aware: bool) -> float:
    """Two families of prompts alternate in the queue; the pool holds one family's prefix at a time, so FCFS
    keeps evicting the prefix the next request needs, while cache-aware admission drains one family first."""
    eng = engine(num_blocks=8, max_num_seqs=1, cache_aware_admission=cache_aware)
    families = {"x": list(range(1, 25)), "y": list(range(101, 125))}  # 6 full blocks each
    eng.blocks.reset_stats()
    for i in range(8):
        family = "xy"[i % 2]
        eng.add_request(families[family] + [200 + i], params(2), request_id=f"{family}{i}", arrival_time=float(i))
    run_to_end(eng)
    stats = eng.blocks.stats
    return stats.hit_tokens / stats.queried_tokens


def test_cache_aware_admission_raises_the_prefix_hit_rate():
    fcfs, aware = hit_rate(False), hit_rate(True)
    assert aware > fcfs + 0.2, (fcfs, aware)


def test_priority_and_policy_validation():
    eng = engine(num_blocks=8, max_num_seqs=2)
    for bad in (1.5, "high", True):
        with pytest.raises(ValueError, match="priority must be an integer"):
            eng.add_request([1, 2], params(1), priority=bad)
    assert not eng.requests
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        SchedulerConfig(scheduling_policy="lifo")
    with pytest.raises(ValueError, match="cache_aware_admission"):
        SchedulerConfig(cache_aware_admission="yes")
