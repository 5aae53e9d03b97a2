"""Chapter 8's lab, the step side on the tiny model: the step profile, the capacity fit and its plan, the direct
prefill cost with the chapter's Baseline, the exercises, and the closing table's computed verdicts."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import pytest

from workbench.lab import ch08
from workbench.lab.ch08.panels_capacity import DIAGONAL, RANGES, STEPS
from workbench.lab.ch08.runs import FAULTS, DashboardRun
from workbench.lab.kit.closing import ClosingTable, Verdict
from workbench.lab.kit.figures import trace
from workbench.monitoring.alerts import AlertResult
from workbench.monitoring.capacity import replicas_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: see tests/conftest.py


@pytest.fixture(scope="module")
def capacity(tiny_model, tokenizer):
    return ch08.CapacityPlanLab(tiny_model, tokenizer, requests=8).run()


@pytest.fixture(scope="module")
def prefill(tiny_model, tokenizer):
    return ch08.prefill_cost(tiny_model, tokenizer, (32, 128), repeats=1, decode_steps=2)


def test_profile(tiny_model, tokenizer, tmp_path):
    # A trace of its own: the panel's default path in the temp dir is shared with a concurrent nbval run of ch08.
    panel = ch08.ProfileLab(tiny_model, tokenizer, steps=3, trace_path=tmp_path / "trace.json")
    assert not panel.measured
    profile = panel.run().result
    assert profile.num_steps == 3 and profile.trace_path.exists()
    assert 0.8 < profile.coverage <= 1.05
    assert list(trace(panel.figures[0], RANGES).x) == list(profile.ranges["range"])
    assert [caption for caption, _ in panel.stored_tables()] == ["time per range", "top operators by self CPU time"]


def test_capacity_plan_and_exercises(capacity):
    fit = capacity.result
    assert fit.costs.prefill_ms_per_token > 0 and capacity.plan["chosen"].sum() <= 1
    assert fit.largest_chunk <= 256 and len(trace(capacity.figures[0], STEPS).x) == len(fit.steps)
    assert len(trace(capacity.figures[0], DIAGONAL).x) == 2
    capacity.itl_slo.value = 1000  # a lenient target: some batch is feasible (redraws, does not re-measure)
    assert capacity.plan["chosen"].sum() == 1 and capacity.result is fit
    ex = ch08.exercises(capacity.plan)
    assert ex["rounding"].check(541) and not ex["rounding"].check(546)
    assert ex["batched"].check(math.ceil(10 / (1000 / (30 + 300 * 150 / 64)) * 1.2))
    assert not ex["batched"].check(math.ceil(10 / (1000 / (30 + 300 * 7.5)) * 1.2))  # the seed's 5-10 ms
    rps = float(capacity.plan.loc[capacity.plan["chosen"], "rps_per_replica"].iloc[0])
    assert ex["replicas"].check(replicas_for(20, rps))


def test_prefill_cost_and_baseline(prefill):
    assert list(prefill.frame.index) == [32, 128] and (prefill.frame["ms_per_token"] > 0).all()
    base = prefill.baseline()
    assert base.chapter == "ch08" and base.prefill_tokens == 128
    assert base.prefill_ms_per_token == pytest.approx(prefill.ms_per_token(128))
    assert base.decode_step_ms == pytest.approx(prefill.decode_ms) and "warm-up" in base.source


def _fake_run(fault: str, fired_at: float | None, ttft_p99: float) -> DashboardRun:
    panels = pd.DataFrame({"waiting": [0.0, 3.0], "kv_usage": [0.1, 0.5], "ttft_p99_s": [0.1, ttft_p99]})
    alert = AlertResult(pd.DataFrame({"time": [0.0, 1.0], "firing": [False, fired_at is not None]}), fired_at)
    bench = type("Bench", (), {"summary": {"completed": 2, "failed": 0}})()
    return DashboardRun(fault, bench, pd.DataFrame(), panels, alert, burst_t=5.0)


def test_closing_table_verdicts_are_computed(capacity, prefill):
    profile = ch08.ProfileLab(capacity.model, capacity.tokenizer, steps=2).run().result
    latency = ch08.TokenLatency(pd.Series([10.0, 11.0]), pd.Series([9.0, 10.0, 12.0, 40.0]), 1.0)
    grafana = pd.DataFrame({"panel": ["a"], "all exported": [True]})
    burst, steady = _fake_run(FAULTS[0], 7.0, 1.5), _fake_run(FAULTS[1], None, 0.2)
    args = dict(latency=latency, profile=profile, fit=capacity.result, prefill=prefill, grafana=grafana,
                rate=5.0, itl_slo_ms=1000)
    table = ch08.closing_table(burst, steady, **args)
    assert isinstance(table, ClosingTable) and len(table) == 5
    assert table.verdicts[0] is Verdict.CAVEAT  # ITL's tail is 3x TPOT's here
    assert table.verdicts[1] is Verdict.NOT_MEASURABLE and table.verdicts[2] is Verdict.CAVEAT
    # results that contradict the claims: the alert also fires on steady load; the burst does not raise TTFT
    noisy = ch08.closing_table(burst, replace(steady, alert=AlertResult(steady.alert.table, 1.0)), **args)
    assert noisy.verdicts[2] is Verdict.WRONG
    flat = ch08.closing_table(replace(burst, panels=burst.panels.assign(ttft_p99_s=0.1)), steady, **args)
    assert flat.verdicts[0] is Verdict.WRONG
    impossible = ch08.closing_table(burst, steady, **{**args, "itl_slo_ms": 1e-3})  # no batch meets the target
    assert impossible.verdicts[4] is Verdict.NOT_MEASURABLE
    assert all(isinstance(v, Verdict) for v in table.verdicts) and "x the" in table.rows[4].measured
    assert "p99 lengths need" in table.rows[4].measured and "not a load test" in table.rows[4].evidence_text
