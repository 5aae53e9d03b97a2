"""Chapter 2's lab without a browser: each panel's engine run and what a control change does to its figure.

A two-layer model with SmolLM2's shapes and random weights keeps the engine runs to a second or two; nothing
here depends on the weights (token identity between modes, block bookkeeping and hit rates do not).
"""

from __future__ import annotations

import pytest

import workbench
from workbench.lab import ch02_kv_cache as ch02
from workbench.lab.kv_runs import access_order, eviction_sweep, prefix_prompts, static_instructions
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
    lab.pattern.value = "skewed (Zipf)"
    assert lab.frame is not frame and "skewed" in lab.figure.layout.title.text
