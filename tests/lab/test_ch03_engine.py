"""Chapter 3's engine runs on the tiny model (real tokenizer, real prefix cache): layouts bill a write then reads,
the warm-up is kept out of the measured requests, the two breakpoint placements, the minimum-length trap, usage
through the HTTP server; and the closing table's verdicts are computed from those results."""

from __future__ import annotations

import pandas as pd
import pytest
from closing_helpers import rows_that_never_turn

from workbench.lab import ch03
from workbench.lab.ch03.panels_engine import TTFT_BAR
from workbench.lab.kit.closing import ClosingTable, Verdict
from workbench.lab.kit.figures import trace


@pytest.fixture(scope="module")
def bench(tiny_model, tokenizer):
    return ch03.HostedBench(tiny_model, tokenizer)


def test_layout_panel_static_first_then_timestamp_first(bench):
    lab = ch03.LayoutLab(bench, num_requests=3).run()
    static = lab.result
    assert len(static.frame) == 3 and static.warmup_ttft_ms > 0  # the warm-up is not one of the rows
    assert static.frame.cache_write.iloc[0] >= 1024 and static.frame.cache_read.iloc[0] == 0
    assert static.frame.engine_cached.iloc[0] == 0  # the warm-up's prefix was forgotten: request 1 is a miss
    assert (static.frame.cache_read.iloc[1:] == static.frame.cache_write.iloc[0]).all()
    assert (static.frame.engine_cached.iloc[1:] > 1000).all() and static.hit_rate > 0.5
    assert list(trace(lab.figure, TTFT_BAR).x) == [1, 2, 3]
    lab.layout_choice.value = "timestamp first"
    dynamic = lab.result
    assert dynamic.hit_rate == 0 and dynamic.writes_every_request and dynamic.hit_ms != dynamic.hit_ms
    assert set(lab.runs) == {"static first", "timestamp first"} and "warm-up" in lab.status.value


def test_multi_turn_moving_breakpoint_reads_more(bench):
    lab = ch03.MultiTurnLab(bench, turns=3).run()
    run = lab.result
    assert run.moving_share > run.fixed_share > 0
    assert run.costs[ch03.MULTI_TURN_VARIANTS[0]] < run.costs[ch03.MULTI_TURN_VARIANTS[1]]


def test_minimum_trap_engine_reuses_what_the_provider_does_not_bill(bench):
    run = ch03.MinimumLab(bench, prompt_tokens=300).run().result
    assert run.prompt_tokens < run.minimum and run.billed_cached == 0 and run.engine_reused > 200


def test_http_usage_adds_up(bench):
    http = ch03.http_usage_run(bench, num_requests=2)
    assert http.fields_add_up and http.anthropic_hit_rate > 0
    assert (http.frame.groupby("api").cache_read.last() >= 1024).all()


# ------------------------------------------------------------------------------------------ closing table
def _frame(reads: list[int], writes: list[int], ttft: list[float], prompt: int = 1147) -> pd.DataFrame:
    return pd.DataFrame({"request": range(len(reads)), "prompt_tokens": prompt, "input_tokens": 43,
                         "cache_write": writes, "cache_read": reads, "engine_cached": [0] + [1120] * (len(reads) - 1),
                         "cost_usd": 0.001, "ttft_ms": ttft})


def _results(dynamic_reads: list[int], moving_reads=(0, 1300, 1500), http_input=(43, 43), http_reads=(0, 1104)):
    static = ch03.LayoutRun("static first", "claude-sonnet-4-5", _frame([0, 1104, 1104], [1104, 0, 0],
                                                                         [3000, 1500, 1500]), 11000)
    dynamic = ch03.LayoutRun("timestamp first", "claude-sonnet-4-5",
                             _frame(dynamic_reads, [1104 if r == 0 else 0 for r in dynamic_reads], [3000] * 3), 3000)
    multi_rows = []
    for name, reads in zip(ch03.MULTI_TURN_VARIANTS, (list(moving_reads), [0, 1104, 1104]), strict=True):
        multi_rows += [{"request": i, "variant": name, "prompt_tokens": 1200 + 200 * i, "cache_read": r,
                        "cost_usd": 0.001 * (3 - i * r / 1500)} for i, r in enumerate(reads)]
    multi = ch03.MultiTurnRun(pd.DataFrame(multi_rows))
    http = ch03.HttpUsage(pd.DataFrame({"api": ["anthropic /v1/messages"] * 2, "request": [0, 1],
                                        "input_tokens": list(http_input), "cache_write": [1104, 0],
                                        "cache_read": list(http_reads),
                                        "engine_cached": [0, 1120], "prompt_tokens": [1147, 1147]}))
    return static, dynamic, multi, http, ch03.daily_economics(requests_per_day=100)


def test_closing_table_verdicts_are_computed():
    table = ch03.closing_table(*_results([0, 0, 0]))
    assert isinstance(table, ClosingTable) and len(table) == 5
    assert table.verdicts == [Verdict.HOLDS, Verdict.CAVEAT, Verdict.CAVEAT, Verdict.WRONG, Verdict.HOLDS]
    assert "cheaper" in table.rows[1].measured and "71" in table.rows[1].note


def test_a_result_that_contradicts_a_claim_turns_its_verdict():
    table = ch03.closing_table(*_results([0, 1104, 1104]))  # the dynamic line on top, yet the cache was read
    assert table.verdicts[0] is Verdict.WRONG and table.verdicts[4] is Verdict.WRONG


def test_every_measured_row_can_turn():
    """Row 2 is the price table's arithmetic: it turns only with other prices."""
    agree = ch03.closing_table(*_results([0, 0, 0]))
    against = ch03.closing_table(*_results([0, 1104, 1104], moving_reads=(0, 900, 1000), http_input=(43, 1104),
                                           http_reads=(0, 0)))  # usage reported nothing cached
    assert rows_that_never_turn(agree, against) == [2]
    assert "over the warm requests" in agree.rows[2].measured and "cold" in agree.rows[2].note


@pytest.mark.slow
def test_hits_are_faster_than_a_warm_miss_on_the_real_model(real_model, tokenizer):
    run = ch03.layout_run(ch03.HostedBench(real_model, tokenizer), "static first", num_requests=3)
    assert run.hit_ms < 0.6 * run.miss_ms


def test_the_chapter_baseline_records_the_miss_and_the_cached_prefix(tiny_model):
    static, dynamic, *_ = _results([0, 0, 0])
    dynamic = ch03.LayoutRun("timestamp first", "claude-sonnet-4-5", dynamic.frame.assign(engine_cached=[0, 16, 16]),
                             3000)
    base = ch03.chapter_baseline({"static first": static, "timestamp first": dynamic}, tiny_model)
    assert base.ttft_miss_ms == 3000 and base.ttft_tokens == 1147 and base.prefill_ms_per_token == 3000 / 1147
    assert base.prefill_cached_tokens == 1147 - 16 and base.prefill_cached_ms_per_token == pytest.approx(3000 / 1131)
