"""Chapter 2's engine panels without a browser: cache vs no cache, the paged run with its block tables, prefix
caching (with the status line when nothing hits), the exercises and the computed closing table.

The panels run on the tiny model (two layers of SmolLM2's shape, random weights): nothing here depends on the
weights (token identity between modes, block bookkeeping and hit rates do not).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
from closing_helpers import rows_that_never_turn

from workbench.lab import ch02
from workbench.lab.ch02.block_view import POOL
from workbench.lab.ch02.budget import kv_share
from workbench.lab.ch02.eviction import EvictionSweep, PolicyComparison
from workbench.lab.ch02.panels import CONTIGUOUS, HIT, MISS, TTFT, prefix_status
from workbench.lab.ch02.runs import WITH_CACHE, WITHOUT_CACHE, CacheComparison, PagedTrace, PrefixRun, prefix_prompts
from workbench.lab.kit.closing import ClosingTable, Verdict
from workbench.lab.kit.contention import BUSY, Contention
from workbench.lab.kit.figures import trace
from workbench.workloads import mixed_lengths, static_instructions


def test_static_instructions_reach_the_requested_length(tokenizer):
    text = static_instructions(tokenizer, 120)
    n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert 120 <= n < 160


def test_cache_vs_no_cache_lab(tiny_model, tokenizer):
    lab = ch02.CacheVsNoCacheLab(tiny_model, tokenizer, context_tokens=24, max_tokens=8)
    assert not lab.measured  # built, not measured
    lab.run()
    result = lab.result
    assert result.same_tokens and result.speedup == result.cached_tokens_per_s / result.recompute_tokens_per_s
    with_cache, without = trace(lab.figure, WITH_CACHE), trace(lab.figure, WITHOUT_CACHE)
    assert len(with_cache.x) == len(without.x) == 7  # the first token (prefill) is not plotted
    assert list(with_cache.x) == list(range(result.prompt_tokens + 1, result.prompt_tokens + 8))
    lab.max_tokens.value = 16
    assert len(trace(lab.figure, WITH_CACHE).x) == 15
    assert "tokens/s" in lab.status.value
    # both modes start with the same prefill: the panel hands that pair to its busy check
    (what, first_s, second_s), = lab.same_work()
    latest = lab.result
    assert what == f"the prefill of {latest.prompt_tokens} tokens"
    assert (first_s, second_s) == (latest.ttft_ms(WITH_CACHE) / 1e3, latest.ttft_ms(WITHOUT_CACHE) / 1e3)
    assert lab.contention is not None and what in [pair[0] for pair in lab.contention.pairs]


@pytest.fixture(scope="module")
def paged_lab(tiny_model, tokenizer):
    workload = mixed_lengths(6, prompt_tokens=(8, 60), output_tokens=(2, 20), seed=1)
    return ch02.PagedMemoryLab(tiny_model, tokenizer, workload=workload, pool_tokens=512, max_num_seqs=3).run()


def test_paged_lab_block_tables_account_for_every_held_block(paged_lab):
    run = paged_lab.result
    for step, tables in enumerate(run.tables):
        blocks = [b for table in tables.values() for b in table]
        assert len(blocks) == len(set(blocks))  # no prefix caching here: no block is shared
        assert len(blocks) == run.timeline["held_blocks"].iloc[step]
        for rid, table in tables.items():
            assert len(table) >= -(-run.tokens[step][rid] // run.block_size)
    assert run.timeline["running"].max() <= 3
    assert run.timeline["held_bytes"].iloc[-1] == 0  # everything freed at the end
    assert len(run.requests) == 6 and len(run.lengths) == 6


def test_paged_lab_controls(paged_lab):
    fig = paged_lab.figure
    contiguous = list(trace(fig, CONTIGUOUS).y)
    run = paged_lab.result
    paged_lab.max_len.value = 512  # redraw only: the same run, a smaller reservation
    assert paged_lab.result is run
    assert list(trace(fig, CONTIGUOUS).y) == pytest.approx([y / 4 for y in contiguous])
    assert "saved" in paged_lab.status.value

    paged_lab.block_size.value = 32  # re-runs the engine
    assert paged_lab.result is not run and paged_lab.result.block_size == 32
    assert "block size 32" in fig.layout.title.text
    assert "of 32 tokens" in paged_lab.view.figure.layout.title.text

    view = paged_lab.view
    view.step.value = 0
    assert trace(view.figure, POOL).z is not None
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


def test_prefix_cache_lab_toggles_and_never_shows_nan(tiny_model, tokenizer):
    lab = ch02.PrefixCacheLab(tiny_model, tokenizer, static_tokens=250, num_requests=4).run()
    run = lab.result
    frame = run.frame
    assert not frame["hit"].iloc[0] and frame["hit"].iloc[1:].all()
    assert (frame["cached_tokens"].iloc[1:] % 16 == 0).all() and run.hit_rate > 0.5
    bar = trace(lab.figure, TTFT)
    assert bar.marker.color[0] == MISS and bar.marker.color[1] == HIT
    assert run.warm_hit_rate == frame["cached_tokens"].iloc[1:].sum() / frame["prompt_tokens"].iloc[1:].sum()
    assert run.warm_hit_rate > run.hit_rate  # the first request has nothing to hit
    assert "without the first, cold one" in lab.status.value and "hit <b>" in lab.status.value

    lab.layout_choice.value = "dynamic first"
    assert lab.result.hit_rate == 0 and lab.result.hits == 0 and math.isnan(lab.result.hit_ms)
    assert len(lab.history) == 2
    # Issue 30: with no hit the line read "hit nan ms (nanx faster)"; it now shows measured TTFTs.
    assert "nan ms" not in lab.status.value and "no request hit the cache" in lab.status.value
    assert f"{lab.result.later_median_ms:.0f} ms" in lab.status.value

    with lab.changes():  # two controls, one run
        lab.layout_choice.value = "static first"
        lab.caching.value = False
    assert len(lab.history) == 3 and lab.result.hit_rate == 0 and "nan ms" not in lab.status.value
    assert "cache off" in lab.history[-1].config


def _prefix_run(layout: str, caching: bool, ttft: list[float], cached: list[int]) -> PrefixRun:
    frame = pd.DataFrame({"request": range(len(ttft)), "prompt_tokens": 500, "cached_tokens": cached,
                          "ttft_ms": ttft})
    frame["hit"] = frame["cached_tokens"] > 0
    return PrefixRun(500, layout, caching, frame, frame["cached_tokens"].sum() / frame["prompt_tokens"].sum())


def test_prefix_status_without_hits_has_no_nan():
    line = prefix_status(_prefix_run("dynamic first", True, [900.0, 880.0, 880.0], [0, 0, 0]))
    assert "nan ms" not in line and "nanx" not in line and "880 ms" in line and "900 ms" in line


# ------------------------------------------------------------------------------ exercises and closing table
@pytest.mark.parametrize("key", ["blocks", "prefix_hit", "fork_blocks", "capacity", "policy"])
def test_exercises_say_right_wrong_and_to_do(key):
    exercise = ch02.exercises()[key]
    expected = exercise.expected()
    assert exercise.check(expected).correct is True
    wrong = "FIFO" if isinstance(expected, str) else expected + 1
    assert exercise.check(wrong).correct is False
    assert exercise.check(...).correct is None


def test_exercise_answers():
    exercises = ch02.exercises()
    assert exercises["blocks"].expected() == 63
    assert exercises["prefix_hit"].expected() == 96
    assert exercises["fork_blocks"].expected() == 6
    assert exercises["policy"].expected() in ("LRU", "LFU")


def _results(*, fast: float = 20.0, same: bool = True, lfu_gap: float = 0.05):
    summary = pd.DataFrame({"decode_tokens_per_s": [fast, 4.0], "prompt_tokens": [98, 98], "ttft_ms": [1.0, 1.0]},
                           index=[WITH_CACHE, WITHOUT_CACHE])
    steps = pd.DataFrame([{"mode": mode, "token_index": i, "step_ms": 1e3 / rate * (1 + 0.01 * (i % 3))}
                          for mode, rate in ((WITH_CACHE, fast), (WITHOUT_CACHE, 4.0)) for i in range(9)])
    cache = CacheComparison(steps, summary, same)
    requests = pd.DataFrame({"request_id": ["r0", "r1"], "prompt_tokens": [100, 37], "output_tokens": [20, 5]})
    paged = PagedTrace(16, 64, 1000, pd.DataFrame(), requests=requests)
    history = [_prefix_run("static first", True, [700.0, 100.0, 100.0], [0, 496, 496]),
               _prefix_run("dynamic first", True, [700.0, 700.0, 700.0], [0, 0, 0]),
               _prefix_run("static first", False, [720.0, 720.0, 720.0], [0, 0, 0])]
    engine = pd.DataFrame({"hit_rate": [0.0, 0.4, 0.75], "evicted_blocks": [9, 3, 0]})
    engine.attrs["working_set_blocks"] = 12
    sim = pd.DataFrame({"budget_blocks": [5, 5], "policy": ["LRU", "LFU"], "hit_rate": [0.2, 0.2 + lfu_gap],
                        "requests_hit": [1, 1], "evicted_blocks": [3, 3]})
    eviction = EvictionSweep("round robin", 3, 9, engine, sim)
    policies = PolicyComparison(5, 200, {"skewed (Zipf)": sim})
    return cache, kv_share(), paged, history, eviction, policies


def test_closing_table_verdicts_are_computed_from_the_results():
    table = ch02.closing_table(*_results())
    assert isinstance(table, ClosingTable) and len(table) == 5
    assert table.verdicts == [Verdict.HOLDS, Verdict.WRONG, Verdict.CAVEAT, Verdict.HOLDS, Verdict.WRONG]
    assert "10–30%" in table.rows[1].note and "last block" in table.rows[2].note
    assert "75 points" in table.rows[4].measured  # whole sentences, nothing cut
    assert all(len(row.measured) > 50 for row in table.rows)


def test_closing_table_turns_with_the_measurements():
    cache, share, paged, history, eviction, policies = _results(fast=3.0, lfu_gap=0.5)
    table = ch02.closing_table(cache, share, paged, history, eviction, policies)
    assert table.verdicts[0] is Verdict.WRONG  # no faster with the cache: the claim is contradicted
    assert table.verdicts[4] is Verdict.HOLDS  # a 50-point policy gap against a 75-point budget effect
    table = ch02.closing_table(cache, share, paged, history[:1], eviction, policies)
    assert table.verdicts[3] is Verdict.NOT_MEASURABLE and "section 7" in table.rows[3].note


def test_every_measured_row_can_turn():
    """Row 2 is arithmetic on the configs and deployments: it turns only with them."""
    agree = ch02.closing_table(*_results())
    cache, share, paged, history, eviction, policies = _results(fast=4.1, lfu_gap=0.5)
    paged = PagedTrace(16, 64, 1000, pd.DataFrame(), requests=pd.DataFrame(
        {"request_id": ["r0"], "prompt_tokens": [2030], "output_tokens": [18]}))
    history = [history[2], _prefix_run("dynamic first", True, [700.0, 100.0, 100.0], [0, 496, 496]),
               _prefix_run("static first", True, [700.0, 700.0, 700.0], [0, 0, 0])]
    against = ch02.closing_table(cache, share, paged, history, eviction, policies)
    assert rows_that_never_turn(agree, against) == [2]


def test_timing_rows_say_the_machine_was_busy_instead_of_concluding():
    """The newcomer's busy run: its cached decode drawn slower, the row said 'wrong'. With the panel's reading
    passed on, the timing rows say the machine was busy; the rows from counts keep their verdicts."""
    quiet, busy = Contention(3.0, 2.9, 0.1), Contention(14.6, 4.6, 10.0)
    cache, share, paged, history, eviction, policies = _results(fast=3.0)
    assert ch02.closing_table(cache, share, paged, history, eviction, policies,
                              cache_contention=quiet).verdicts[0] is Verdict.WRONG
    table = ch02.closing_table(cache, share, paged, history, eviction, policies, cache_contention=busy,
                               prefix_contentions=(quiet, busy))
    assert table.verdicts[0] is Verdict.NOT_MEASURABLE and table.rows[0].note.startswith(BUSY)
    assert table.verdicts[3] is Verdict.NOT_MEASURABLE and "waited for a CPU 68%" in table.rows[3].note
    counts = ch02.closing_table(cache, share, paged, history, eviction, policies).verdicts
    assert [table.verdicts[i] for i in (1, 2, 4)] == [counts[i] for i in (1, 2, 4)]


def test_the_chapter_baseline_records_what_section_3_and_7_timed(tiny_model):
    cache, _, _, history, _, _ = _results()
    base = ch02.chapter_baseline(cache, history, tiny_model)
    assert base.chapter == "ch02" and base.decode_step_ms == pytest.approx(1e3 / 20.0, rel=0.02)
    assert base.prefill_ms_per_token == pytest.approx(720.0 / 500) and base.prefill_tokens == 500
    assert base.prefill_cached_ms_per_token == pytest.approx(100.0 / 4) and base.prefill_cached_tokens == 4
    assert "prefill_cached_ms_per_token" in base.explanations  # few new tokens: one forward's fixed cost each
