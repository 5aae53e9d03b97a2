"""Chapter 3's price-table side: the economics panel follows its controls and reads the daily break-even, the TTL
timeline, the seed's worked example, and the exercises (right, wrong, unanswered)."""

from __future__ import annotations

import pytest

from workbench.hosted.costs import break_even_requests, daily_costs
from workbench.lab import ch03
from workbench.lab.kit.figures import trace
from workbench.workloads import static_instructions


def test_economics_panel_measures_when_run_and_follows_its_controls():
    lab = ch03.EconomicsLab(requests_per_day=10_000)
    assert not lab.measured
    lab.run()
    busy = lab.result.point["cached_per_day"]
    assert lab.result.cheaper_with_caching and lab.result.comparison == "cheaper"
    lab.rate.value = 30  # a request every ~48 min: the 5-minute entry is nearly always gone
    e = lab.result
    assert e.point["hit_rate"] < 0.1 and not e.cheaper_with_caching and e.comparison == "dearer"
    assert list(trace(lab.figure, "chosen rate").x) == [30] and busy != e.point["cached_per_day"]
    lab.ttl.value = "extended"
    assert lab.ttl_name == "1h" and lab.result.break_even == break_even_requests("anthropic", "claude-sonnet-4-6", "1h")
    assert "1h" in lab.figure.layout.title.text and "N*" in lab.status.value
    assert len(lab.stored_tables()) == 1


def test_the_daily_break_even_separates_cheaper_from_dearer():
    e = ch03.daily_economics(requests_per_day=100)
    per_day = e.break_even_per_day
    assert 60 < per_day < 80 and e.comparison == "cheaper"  # the course's 100 a day is above it
    below = daily_costs("anthropic", "claude-sonnet-4-6", prefix_tokens=4000, requests_per_day=per_day * 0.9,
                        ttl="5m")
    above = daily_costs("anthropic", "claude-sonnet-4-6", prefix_tokens=4000, requests_per_day=per_day * 1.1,
                        ttl="5m")
    assert below["saving_per_day"] < 0 < above["saving_per_day"]
    assert ch03.break_even_per_day("openai", "gpt-4o", prefix_tokens=4000, ttl="in_memory") == 0.0
    assert ch03.break_even_per_day("anthropic", "claude-opus-4-6", prefix_tokens=1000, ttl="5m") is None


def test_ttl_panel_five_minutes_vs_one_hour(tokenizer):
    lab = ch03.TTLLab(tokenizer, static_instructions(tokenizer, 1100)).run()
    short = lab.result
    lab.ttl.value = "1h"
    long = lab.result
    assert 1 <= long.writes < short.writes
    assert short.frame.write.iloc[0] > 0 and short.frame.read.iloc[1] > 0
    assert long.cost_usd < long.uncached_usd and "1h" in lab.status.value


def test_exercises_right_wrong_unanswered():
    exercises = ch03.exercises()
    assert exercises["break_even_1h"].check(3).correct is True
    assert exercises["break_even_1h"].check(2).correct is False
    assert exercises["openai_cached"].check(1408).correct is True
    assert exercises["openai_cached"].check(1500).correct is False
    assert exercises["hit_probability"].check(...).correct is None
    right = exercises["hit_probability"].check(0.2934)
    assert right.correct is True and "costs less" in right.message  # the computed comparison, not "more"


def test_seed_example_table_recomputes_the_course():
    table = ch03.seed_example_table().set_index("quantity")
    assert table.loc["uncached per day", "computed here"] == "$120.00"
    assert table.loc["break-even requests", "computed here"].startswith("1.278")


@pytest.mark.parametrize("name", ["EconomicsLab", "TTLLab", "LayoutLab", "MultiTurnLab", "MinimumLab"])
def test_panels_do_not_measure_when_built(name, tokenizer, tiny_model, monkeypatch):
    cls = getattr(ch03, name)
    monkeypatch.setattr(cls, "measure", lambda self: pytest.fail("measured on construction"))
    if name == "EconomicsLab":
        cls()
    elif name == "TTLLab":
        cls(tokenizer, "static text")
    else:
        class Bench:  # the engine panels only read the bench's model (for the subtitle) until they run
            model = tiny_model

        cls(Bench())
