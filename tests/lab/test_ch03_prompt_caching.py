"""Chapter 3's lab: panels redraw from their controls, the engine runs bill writes then reads with lower
TTFT on the read, the closing table reads the runs, and the exercises say right, wrong and unanswered."""

from __future__ import annotations

import pytest

from workbench.hosted.costs import break_even_requests
from workbench.lab import ch03_prompt_caching as ch03
from workbench.workloads import static_instructions


def test_economics_panel_follows_its_controls():
    lab = ch03.EconomicsLab(requests_per_day=10_000)
    busy = lab.point["cached_per_day"]
    assert lab.point["cached_per_day"] < lab.point["uncached_per_day"]
    lab.rate.value = 30  # a request every ~48 min: the 5-minute entry is nearly always gone
    assert lab.point["hit_rate"] < 0.1 and lab.point["cached_per_day"] > lab.point["uncached_per_day"]
    assert list(lab.figure.data[2].x) == [30] and busy != lab.point["cached_per_day"]
    lab.ttl.value = "extended"
    assert lab.ttl_name == "1h" and lab.break_even == break_even_requests("anthropic", "claude-sonnet-4-6", "1h")
    assert "1h" in lab.figure.layout.title.text and "N*" in lab.status.value
    assert len(lab.stored_tables()) == 1


def test_ttl_panel_five_minutes_vs_one_hour(tokenizer):
    lab = ch03.TTLLab(tokenizer, static_instructions(tokenizer, 1100))
    short_writes = int((lab.frame.read == 0).sum())
    lab.ttl.value = "1h"
    long_writes = int((lab.frame.read == 0).sum())
    assert long_writes < short_writes and long_writes >= 1
    assert lab.frame.write.iloc[0] > 0 and lab.frame.read.iloc[1] > 0


def test_exercises_right_wrong_unanswered():
    exercises = ch03.EXERCISES
    assert exercises["break_even_1h"].check(3).correct is True
    assert exercises["break_even_1h"].check(2).correct is False
    assert exercises["openai_cached"].check(1408).correct is True
    assert exercises["openai_cached"].check(1500).correct is False
    assert exercises["hit_probability"].check(...).correct is None
    assert exercises["hit_probability"].check(0.2915).correct is True


def test_seed_example_table_recomputes_the_course():
    table = ch03.seed_example_table().set_index("quantity")
    assert table.loc["uncached per day", "computed here"] == "$120.00"
    assert table.loc["break-even requests", "computed here"].startswith("1.278")


@pytest.mark.slow
def test_engine_runs_and_takeaways(real_model, tokenizer):
    bench = ch03.HostedBench(real_model, tokenizer)
    static = bench.layout_run("static first", num_requests=2)
    assert static.cache_write.iloc[0] >= 1024 and static.cache_read.iloc[1] == static.cache_write.iloc[0]
    assert static.engine_cached.iloc[1] > 1000 and static.ttft_ms.iloc[1] < 0.6 * static.ttft_ms.iloc[0]
    dynamic = bench.layout_run("timestamp first", num_requests=2)
    assert dynamic.cache_read.sum() == 0 and dynamic.cache_write.iloc[1] > 0
    multi = ch03.multi_turn_run(bench, turns=2)
    http = ch03.http_usage_run(bench, num_requests=2)
    assert (http.prompt_tokens == http.input_tokens + http.cache_write + http.cache_read).all()
    assert (http.groupby("api").cache_read.last() >= 1024).all()
    table = ch03.takeaways({"static first": static, "timestamp first": dynamic}, multi, http)
    assert len(table) == 5 and table.verdict.iloc[3] == "wrong"
    later = multi[multi.request > 0]
    moving, fixed = (later[later.variant == v] for v in ch03.MULTI_TURN_VARIANTS)
    assert moving.cache_read.iloc[0] > fixed.cache_read.iloc[0]
