"""Chapter 2's lab without a browser: each panel's engine run and what a control change does to its figure, the
LRU/LFU simulator against the engine, the memory budget, the copy-on-write fork, the exercises and the table.

A two-layer model with SmolLM2's shapes and random weights keeps the engine runs to a second or two; nothing
here depends on the weights (token identity between modes, block bookkeeping and hit rates do not).
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import workbench
from workbench.cache.sizing import weight_bytes
from workbench.lab import ch02_kv_cache as ch02
from workbench.lab.ch01_measures import TensorPeak
from workbench.lab.ch02_budget import activation_bytes, deployment_budget, kv_share_table, share_verdict
from workbench.lab.ch02_eviction import budgets_for
from workbench.lab.ch02_fork import COPIED, PRIVATE, SHARED
from workbench.lab.ch02_policy_sim import PrefixCacheSim, policy_sweep, simulate
from workbench.lab.kit.notebook import GiB
from workbench.lab.kv_runs import (
    CacheComparison,
    access_order,
    eviction_prompts,
    eviction_sweep,
    prefix_prompts,
    static_instructions,
)
from workbench.models.attention import NoCacheAttention
from workbench.workloads import mixed_lengths


@pytest.fixture(scope="module")
def tiny_model():
    return workbench.random_model("smollm2-135m", num_layers=2, device="cpu")


def test_static_instructions_reach_the_requested_length(tokenizer):
    text = static_instructions(tokenizer, 120)
    n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert 120 <= n < 160


def test_cache_vs_no_cache_lab(tiny_model, tokenizer):
    lab = ch02.CacheVsNoCacheLab(tiny_model, tokenizer, context_tokens=24, max_tokens=8)
    assert lab.result.same_tokens
    with_cache, without = lab.figure.data
    assert len(with_cache.x) == len(without.x) == 7  # the first token (prefill) is not plotted
    assert list(with_cache.x) == list(range(lab.result.summary["prompt_tokens"].iloc[0] + 1,
                                            lab.result.summary["prompt_tokens"].iloc[0] + 8))
    lab.max_tokens.value = 16
    assert len(lab.figure.data[0].x) == 15
    assert "tokens/s" in lab.status.value


@pytest.fixture(scope="module")
def paged_lab(tiny_model, tokenizer):
    workload = mixed_lengths(6, prompt_tokens=(8, 60), output_tokens=(2, 20), seed=1)
    return ch02.PagedMemoryLab(tiny_model, tokenizer, workload=workload, pool_tokens=512, max_num_seqs=3)


def test_paged_lab_block_tables_account_for_every_held_block(paged_lab):
    trace = paged_lab.trace
    for step, tables in enumerate(trace.tables):
        blocks = [b for table in tables.values() for b in table]
        assert len(blocks) == len(set(blocks))  # no prefix caching here: no block is shared
        assert len(blocks) == trace.timeline["held_blocks"].iloc[step]
        for rid, table in tables.items():
            assert len(table) >= -(-trace.tokens[step][rid] // trace.block_size)
    assert trace.timeline["running"].max() <= 3
    assert trace.timeline["held_bytes"].iloc[-1] == 0  # everything freed at the end
    assert len(trace.requests) == 6


def test_paged_lab_controls(paged_lab):
    fig = paged_lab.figure
    contiguous = list(fig.data[0].y)
    trace = paged_lab.trace
    paged_lab.max_len.value = 512  # redraw only: the same run, a smaller reservation
    assert paged_lab.trace is trace
    assert list(fig.data[0].y) == pytest.approx([y / 4 for y in contiguous])
    assert all(c <= h or c == 0 for c, h in zip(fig.data[0].y, fig.data[0].y, strict=True))
    assert "saved" in paged_lab.status.value

    paged_lab.block_size.value = 32  # re-runs the engine
    assert paged_lab.trace is not trace and paged_lab.trace.block_size == 32
    assert "block size 32" in fig.layout.title.text
    assert "of 32 tokens" in paged_lab.view.figure.layout.title.text

    view = paged_lab.view
    z_before = [row[:] for row in view.figure.data[0].z]
    view.step.value = 0
    assert view.figure.data[0].z != z_before or view.step.value == 0
    assert "Block tables at step 0" in view.tables_caption() and "step 0" in view.figure.layout.title.text
    caption, table = paged_lab.stored_tables()[0]
    assert caption == view.tables_caption() and list(table.columns) == ["tokens", "block table"]
    assert fig.layout.shapes[0].x0 == 0  # the timeline marks the replayed step


def test_prefix_prompts_layouts(tokenizer):
    static_first = prefix_prompts(tokenizer, 3, 100, "static first")
    dynamic_first = prefix_prompts(tokenizer, 3, 100, "dynamic first")
    common = sum(1 for a, b in zip(static_first[0], static_first[1], strict=False) if a == b)
    assert common >= 100
    first_diff = next(i for i, (a, b) in enumerate(zip(*dynamic_first[:2], strict=False)) if a != b)
    assert first_diff < 16  # differs inside the first block: nothing to share
    with pytest.raises(ValueError, match="layout"):
        prefix_prompts(tokenizer, 2, 50, "middle")


def test_prefix_cache_lab_toggles(tiny_model, tokenizer):
    lab = ch02.PrefixCacheLab(tiny_model, tokenizer, static_tokens=250, num_requests=4)
    frame = lab.frame
    assert not frame["hit"].iloc[0] and frame["hit"].iloc[1:].all()
    assert (frame["cached_tokens"].iloc[1:] % 16 == 0).all() and lab.hit_rate > 0.5
    assert lab.figure.data[0].marker.color[0] == ch02.MISS and lab.figure.data[0].marker.color[1] == ch02.HIT

    lab.layout_choice.value = "dynamic first"
    assert lab.hit_rate == 0 and not lab.frame["hit"].any()
    assert len(lab.history) == 2 and len(lab.history_figure.data[0].x) == 2

    with lab.changes():  # two controls, one run
        lab.layout_choice.value = "static first"
        lab.caching.value = False
    assert len(lab.history) == 3 and lab.hit_rate == 0
    assert "cache off" in lab.history[-1]["config"]


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
    lab = ch02.EvictionLab(tiny_model, tokenizer, num_prefixes=3, num_requests=9)
    frame = lab.frame
    working = frame.attrs["working_set_blocks"]
    assert working == 12
    assert frame["hit_rate"].iloc[0] == 0  # smallest budget: LRU evicts exactly what comes next
    assert frame.loc[frame["budget_blocks"] > working, "hit_rate"].min() > 0.5
    assert list(lab.figure.data[0].x) == list(frame["budget_blocks"])
    # The LRU/LFU simulator replays the same stream: its LRU must reproduce the engine's hits and evictions.
    assert lab.simulator_matches_engine() and "matches it exactly: <b>True</b>" in lab.status.value
    assert list(lab.figure.data[3].y) == list(lab.figure.data[2].y)  # round robin: no hits, so no use counts
    lab.pattern.value = "skewed (Zipf)"
    assert lab.frame is not frame and "skewed" in lab.figure.layout.title.text
    assert lab.simulator_matches_engine()


def test_prefix_lab_reports_the_hit_rate_without_the_cold_request(tiny_model, tokenizer):
    lab = ch02.PrefixCacheLab(tiny_model, tokenizer, static_tokens=250, num_requests=4)
    s = lab.summary()
    warm = lab.frame.iloc[1:]
    assert s["warm_hit_rate"] == warm["cached_tokens"].sum() / warm["prompt_tokens"].sum()
    assert s["warm_hit_rate"] > s["hit_rate"]  # the first request has nothing to hit
    assert s["hit_rate"] == pytest.approx(lab.frame["cached_tokens"].sum() / lab.frame["prompt_tokens"].sum())
    assert "without the first, cold one" in lab.status.value


def test_shifting_pattern_reverses_the_hot_set_halfway():
    order = access_order(4, 400, "shifting hot set")
    first, second = order[:200], order[200:]
    assert first.count(0) > first.count(3) and second.count(3) > second.count(0)
    prompts = eviction_prompts(3, 5, "round robin")
    assert prompts[0][:64] == prompts[3][:64] and prompts[0][64:] != prompts[3][64:]


# ------------------------------------------------------------------------------------------- LRU vs LFU
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
    lab = ch02.PolicyLab(num_prefixes=5, num_requests=200)
    gaps = lab.policy_gaps()
    assert set(gaps) == {"skewed (Zipf), 200 requests", "shifting hot set, 200 requests"}
    assert gaps["skewed (Zipf), 200 requests"] > 0 > gaps["shifting hot set, 200 requests"]
    assert len(lab.figure.data) == 4 and "+" in lab.status.value
    lab.num_requests.value = 50
    assert "50 requests" in lab.figure.layout.title.text and len(lab.sims["skewed (Zipf)"]) == 2 * len(
        budgets_for(5))


def test_policy_sweep_has_a_row_per_budget_and_policy():
    prompts = eviction_prompts(4, 40, "skewed (Zipf)")
    frame = policy_sweep(prompts, [5, 8, 24], 16)
    assert len(frame) == 6 and set(frame["policy"]) == {"LRU", "LFU"}
    big = frame[frame["budget_blocks"] == 24]
    assert big["hit_rate"].nunique() == 1 and (big["evicted_blocks"] == 0).all()  # working set + one request fit


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
    before = list(lab.figure.data[0].x)
    assert "weights do not fit" in lab.figure.data[0].text
    lab.utilization.value = 0.95
    assert sum(lab.figure.data[0].x) > sum(before)
    assert "10–30%" in lab.status.value and len(lab.stored_tables()) == 1


def test_kv_capacity_lab_budget_line_and_window():
    lab = ch02.KVCapacityLab(model="llama-3-8b", gpu="80 GiB GPU")
    assert lab.figure.data[-1].y[0] == pytest.approx(lab.budget.kv_budget_bytes / GiB)
    assert lab.max_sequences()[8192] == lab.budget.num_blocks // 512
    assert not lab.figure.data[3].visible  # 32,768 is past Llama-3-8B's 8,192-token limit
    lab.model.value = "llama-3-70b"
    assert lab.budget is None and "no room" in lab.status.value and len(lab.figure.data[-1].y) == 0
    lab.gpus.value = 4
    assert lab.budget is not None and "4 x 80 GiB GPU" in lab.status.value
    lab.model.value = "mistral-7b"  # a 4,096-token window: longer contexts keep the same KV
    assert list(lab.figure.data[2].y) == list(lab.figure.data[1].y)


# ----------------------------------------------------------------------------------- copy-on-write fork
def test_parallel_sampling_shares_the_prompt_and_copies_on_write(tiny_model, tokenizer):
    lab = ch02.ParallelSamplingLab(tiny_model, tokenizer, n=3, prompt_tokens=40, max_tokens=6)
    first, second = lab.trace.steps[0], lab.trace.steps[1]
    assert first.tables[0] == first.tables[1] == first.tables[2] and len(first.tables[0]) == 3
    assert all(count == 3 for count in first.refs.values())  # forked: every prompt block shared by all three
    assert sum(len(c) for c in second.copied) == 2  # the last writer keeps the original partial block
    assert len({b for t in second.tables for b in t}) == 2 + 3
    assert lab.trace.held_blocks()[-1] < lab.trace.unshared_blocks()[-1]
    z, _, _ = lab.cells(1)
    assert z[0][:2] == [SHARED, SHARED] and sorted(row[2] for row in z) == [PRIVATE, COPIED, COPIED]
    lab.step.value = 0  # redraw only
    assert "after engine step 0" in lab.grid.layout.title.text
    assert lab.stored_tables()[0][0] == "Block tables after step 0"
    lab.n.value = 4
    assert len(lab.trace.steps[0].tables) == 4 and lab.trace.copies() == 3


# ----------------------------------------------------------------------------------- exercises and closing table
@pytest.mark.parametrize("key", sorted(ch02.EXERCISES))
def test_exercises_say_right_wrong_and_to_do(key):
    exercise = ch02.EXERCISES[key]
    expected = exercise.expected()
    assert exercise.check(expected).correct is True
    wrong = "FIFO" if isinstance(expected, str) else expected + 1
    assert exercise.check(wrong).correct is False
    assert exercise.check(...).correct is None


def test_exercise_answers():
    assert ch02.EXERCISES["blocks"].expected() == 63
    assert ch02.EXERCISES["prefix_hit"].expected() == 96
    assert ch02.EXERCISES["fork_blocks"].expected() == 6
    assert ch02.EXERCISES["policy"].expected() in ("LRU", "LFU")


def test_takeaways_verdicts_follow_the_measurements():
    summary = pd.DataFrame({"decode_tokens_per_s": [20.0, 4.0]}, index=["with KV cache", "without"])
    result = CacheComparison(pd.DataFrame(), summary, True)
    history = [{"layout": "static first", "caching": True, "later_median_ms": 100.0, "hit_rate": 0.8},
               {"layout": "dynamic first", "caching": True, "later_median_ms": 700.0, "hit_rate": 0.0},
               {"layout": "static first", "caching": False, "later_median_ms": 720.0, "hit_rate": 0.0}]
    engine = pd.DataFrame({"hit_rate": [0.0, 0.4, 0.75]})
    lengths = [(100, 20), (37, 5)]
    table = ch02.takeaways(result, kv_share_table(), lengths, 1000, history, engine, {"a": 0.05, "b": -0.1})
    assert len(table) == 5 and table.loc[1, "verdict"] == "holds" and table.loc[4, "verdict"] == "holds"
    assert "wrong as a rule" in table.loc[2, "verdict"] and "caveat" in table.loc[3, "verdict"]
    assert table.loc[5, "verdict"].startswith("overstated")
    assert ch02.takeaways(result, kv_share_table(), lengths, 1000, history, engine,
                          {"a": 0.5}).loc[5, "verdict"] == "holds"
    assert ch02.takeaways(result, kv_share_table(), lengths, 1000, history[:1], engine,
                          {"a": 0.5}).loc[4, "verdict"] == "not measured"
