"""Chapter 2's memory planning, copy-on-write forks and eviction: the KV share a serving engine leaves, the
capacity panel, parallel sampling on the paged cache, the eviction sweep on the engine and the LRU/LFU
simulator against it. Engine runs use the tiny model (hit rates and block bookkeeping do not depend on weights).
"""

from __future__ import annotations

import pytest
import torch

import workbench
from workbench.cache.sizing import weight_bytes
from workbench.lab import ch02
from workbench.lab.ch01.memory import TensorPeak
from workbench.lab.ch02.budget import activation_bytes, deployment_budget, kv_share_table, share_verdict
from workbench.lab.ch02.eviction import access_order, budgets_for, eviction_prompts, eviction_sweep
from workbench.lab.ch02.fork import COPIED, PRIVATE, SHARED
from workbench.lab.ch02.panels_capacity import BUDGET_LINE, SHARE_BAR, context_trace
from workbench.lab.ch02.panels_eviction import ENGINE_TOKENS, SIMULATED, policy_trace
from workbench.lab.ch02.policy_sim import PrefixCacheSim, policy_sweep, simulate
from workbench.lab.kit.figures import trace
from workbench.lab.kit.notebook import GiB
from workbench.models.attention import NoCacheAttention


# ----------------------------------------------------------------------------------------- memory budget
@pytest.mark.parametrize("spec", [workbench.model_spec("smollm2-135m").replace(num_layers=1),
                                  workbench.model_spec("smollm2-135m").replace(
                                      num_layers=1, hidden_size=256, intermediate_size=704, num_heads=8,
                                      num_kv_heads=2, head_dim=32, vocab_size=512)])
def test_activation_bytes_is_what_a_forward_allocates(spec):
    model = workbench.random_model(spec, device="cpu")
    n = 48
    ids, positions = torch.randint(0, spec.vocab_size, (n,)), torch.arange(n)
    with torch.inference_mode(), TensorPeak() as peak:
        model(ids, positions, NoCacheAttention([n], model.attention_scale))
    assert peak.peak == activation_bytes(spec, n, torch.float32)


def test_deployment_budget_leaves_the_kv_cache_what_weights_and_activations_leave():
    budget = deployment_budget("llama-3-8b", 80 * GiB)
    spec = workbench.model_spec("llama-3-8b")
    assert budget.kv_budget_bytes == int(0.9 * 80 * GiB) - weight_bytes(spec, torch.bfloat16) - activation_bytes(
        spec, 8192)
    assert deployment_budget("llama-3-70b", 80 * GiB) is None  # 131 GiB of weights
    assert deployment_budget("llama-3-70b", 80 * GiB, 4).num_blocks > 0
    with pytest.raises(ValueError, match="gpus"):
        deployment_budget("llama-3-8b", 80 * GiB, 0)


def test_kv_share_table_divides_memory_and_tests_the_seeds_range():
    table = kv_share_table()
    fits = table.dropna()
    parts = fits[["weights", "activations", "kv_cache", "held_back"]].sum(axis=1)
    assert ((parts <= 1) & (parts > 0.999)).all()  # up to one block's worth of rounding
    verdict = share_verdict(table)
    assert verdict["lowest"] < 0.10 < 0.30 < verdict["highest"]  # the course's 10-30% is not a rule
    assert verdict["not_fitting"] == 1 and verdict["fitting"] == len(fits)
    assert table.loc["llama-3-70b on 2 x 80 GiB GPU", "kv_cache"] < table.loc["llama-3-70b on 8 x 80 GiB GPU",
                                                                              "kv_cache"]


def test_kv_share_lab_controls():
    lab = ch02.KVShareLab()
    assert not lab.measured
    lab.run()
    before = list(trace(lab.figure, SHARE_BAR).x)
    assert "weights do not fit" in trace(lab.figure, SHARE_BAR).text
    lab.utilization.value = 0.95
    assert sum(trace(lab.figure, SHARE_BAR).x) > sum(before) and lab.result.utilization == 0.95
    assert "10–30%" in lab.status.value and len(lab.stored_tables()) == 1


def test_kv_capacity_lab_budget_line_and_window():
    lab = ch02.KVCapacityLab(model="llama-3-8b", gpu="80 GiB GPU").run()
    budget = lab.result.budget
    assert trace(lab.figure, BUDGET_LINE).y[0] == pytest.approx(budget.kv_budget_bytes / GiB)
    assert lab.result.max_sequences()[8192] == budget.num_blocks // 512
    assert not trace(lab.figure, context_trace(32768)).visible  # past Llama-3-8B's 8,192-token limit
    lab.model.value = "llama-3-70b"
    assert lab.result.budget is None and "no room" in lab.status.value and len(trace(lab.figure, BUDGET_LINE).y) == 0
    lab.gpus.value = 4
    assert lab.result.budget is not None and "4 x 80 GiB GPU" in lab.status.value
    lab.model.value = "mistral-7b"  # a 4,096-token window: longer contexts keep the same KV
    assert list(trace(lab.figure, context_trace(8192)).y) == list(trace(lab.figure, context_trace(4096)).y)


# ----------------------------------------------------------------------------------- copy-on-write fork
def test_parallel_sampling_shares_the_prompt_and_copies_on_write(tiny_model, tokenizer):
    lab = ch02.ParallelSamplingLab(tiny_model, tokenizer, n=3, prompt_tokens=40, max_tokens=6).run()
    first, second = lab.result.steps[0], lab.result.steps[1]
    assert first.tables[0] == first.tables[1] == first.tables[2] and len(first.tables[0]) == 3
    assert all(count == 3 for count in first.refs.values())  # forked: every prompt block shared by all three
    assert sum(len(c) for c in second.copied) == 2  # the last writer keeps the original partial block
    assert len({b for t in second.tables for b in t}) == 2 + 3
    assert lab.result.held_blocks()[-1] < lab.result.unshared_blocks()[-1]
    z, _, _ = lab.cells(1)
    assert z[0][:2] == [SHARED, SHARED] and sorted(row[2] for row in z) == [PRIVATE, COPIED, COPIED]
    lab.step.value = 0  # redraw only
    assert "after engine step 0" in lab.grid.layout.title.text
    assert lab.stored_tables()[0][0] == "Block tables after step 0"
    lab.n.value = 4
    assert len(lab.result.steps[0].tables) == 4 and lab.result.copies() == 3


# ---------------------------------------------------------------------------------------------- eviction
def test_access_order_patterns():
    assert access_order(3, 7, "round robin") == [0, 1, 2, 0, 1, 2, 0]
    skewed = access_order(4, 200, "skewed (Zipf)")
    assert skewed.count(0) > skewed.count(3)
    with pytest.raises(ValueError, match="pattern"):
        access_order(3, 5, "random")


def test_eviction_sweep_rejects_a_budget_smaller_than_one_request(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="budget"):
        eviction_sweep(tiny_model, tokenizer, [2, 8])


def test_eviction_lab_round_robin_thrashes_until_the_working_set_fits(tiny_model, tokenizer):
    lab = ch02.EvictionLab(tiny_model, tokenizer, num_prefixes=3, num_requests=9).run()
    sweep = lab.result
    frame = sweep.frame
    assert sweep.working_set == 12
    assert frame["hit_rate"].iloc[0] == 0  # smallest budget: LRU evicts exactly what comes next
    assert frame.loc[frame["budget_blocks"] > sweep.working_set, "hit_rate"].min() > 0.5
    assert list(trace(lab.figure, ENGINE_TOKENS).x) == list(frame["budget_blocks"])
    # The LRU/LFU simulator replays the same stream: its LRU must reproduce the engine's hits and evictions.
    assert sweep.simulator_matches_engine and "matches it exactly: <b>True</b>" in lab.status.value
    # round robin: no hits before the working set fits, so no use counts to tell LFU from LRU
    assert list(trace(lab.figure, SIMULATED["LFU"]).y) == list(trace(lab.figure, SIMULATED["LRU"]).y)
    lab.pattern.value = "skewed (Zipf)"
    assert lab.result is not sweep and "skewed" in lab.figure.layout.title.text
    assert lab.result.simulator_matches_engine


def test_shifting_pattern_reverses_the_hot_set_halfway():
    order = access_order(4, 400, "shifting hot set")
    first, second = order[:200], order[200:]
    assert first.count(0) > first.count(3) and second.count(3) > second.count(0)
    prompts = eviction_prompts(3, 5, "round robin")
    assert prompts[0][:64] == prompts[3][:64] and prompts[0][64:] != prompts[3][64:]


def test_lfu_keeps_a_hot_prefix_that_one_off_prompts_push_out_of_lru():
    hot, scan = [list(range(1, 33)) + [99]], [[1000 * k + i for i in range(33)] for k in range(1, 4)]
    # hot, hot, hot, then three one-off prompts, then hot again; 6 blocks hold one request and one cached prefix.
    stream = hot * 3 + scan + hot
    lru, lfu = simulate(stream, 6, 16, "LRU"), simulate(stream, 6, 16, "LFU")
    assert lru.requests_hit == 2 and lfu.requests_hit == 3  # only LFU still has the hot prefix at the end
    assert lfu.hit_tokens == 3 * 32 and lru.hit_tokens == 2 * 32
    with pytest.raises(ValueError, match="policy"):
        PrefixCacheSim(4, 16, "FIFO")
    with pytest.raises(ValueError, match="blocks"):
        simulate(stream, 2, 16, "LRU")  # one request needs 3 blocks


def test_policy_lab_compares_lfu_and_lru_on_longer_streams():
    lab = ch02.PolicyLab(num_prefixes=5, num_requests=200).run()
    gaps = lab.result.policy_gaps
    assert set(gaps) == {"skewed (Zipf), 200 requests", "shifting hot set, 200 requests"}
    assert gaps["skewed (Zipf), 200 requests"] > 0 > gaps["shifting hot set, 200 requests"]
    assert len(lab.figure.data) == 4 and "+" in lab.status.value
    assert len(trace(lab.figure, policy_trace("shifting hot set", "LFU")).x) == len(budgets_for(5))
    lab.num_requests.value = 50
    assert "50 requests" in lab.figure.layout.title.text and len(lab.result.sims["skewed (Zipf)"]) == 2 * len(
        budgets_for(5))


def test_policy_sweep_has_a_row_per_budget_and_policy():
    prompts = eviction_prompts(4, 40, "skewed (Zipf)")
    frame = policy_sweep(prompts, [5, 8, 24], 16)
    assert len(frame) == 6 and set(frame["policy"]) == {"LRU", "LFU"}
    big = frame[frame["budget_blocks"] == 24]
    assert big["hit_rate"].nunique() == 1 and (big["evicted_blocks"] == 0).all()  # working set + one request fit
