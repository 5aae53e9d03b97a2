"""Chapter 8's lab: the seed's planning arithmetic, the server the notebook starts (and always stops), the
dashboard panel over a live server with a fault, the profile and capacity panels, the Grafana check and the
exercises. The panels run on the notebook's 2-layer serving model so this file stays fast."""

from __future__ import annotations

import math

import pytest

from workbench.lab import ch08_monitoring as ch08
from workbench.lab.ch08_panels import FAULTS, GRID, dashboard_load
from workbench.lab.kit.notebook import model_label
from workbench.monitoring.capacity import replicas_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: see tests/conftest.py


def test_seed_planning_and_prefill_floor():
    table = ch08.seed_planning()["value"]
    assert table["GPUs, exact"] == pytest.approx(540.36)
    assert (table["its code returns (round to nearest)"], table["its prose prints (rps rounded to 0.022 first)"],
            table["rounded up, as sizing must"]) == (540, 546, 541)
    floor = ch08.prefill_check()
    assert 400 < floor["floor_ms"] < 500 and floor["seed_over_peak"] > 8


def test_the_fault_is_a_burst_on_top_of_the_steady_load():
    steady, burst = dashboard_load(FAULTS[1]), dashboard_load(FAULTS[0])
    assert len(steady) == 60 and len(burst) == 68
    assert [len(r.prompt) for r in burst if r.tags["kind"] == "burst"] == [1500] * 8


def test_server_dashboard_grafana_and_stop(tokenizer):
    server = ch08.serve(tokenizer)
    try:
        assert server.port_open() and "(random weights)" in model_label(ch08.serving_model())
        grafana = ch08.grafana_check(server.url)
        assert len(grafana) >= 10 and grafana["all exported"].all()
        dash = ch08.DashboardLab(server.url, "test", fault=FAULTS[0])
        p = dash.panels
        assert dash.bench.summary["completed"] == 68 and dash.bench.summary["failed"] == 0
        assert p["waiting"].max() >= 1 and p["kv_usage"].max() > 0.1 and p["running"].iloc[-1] == 0
        assert len(dash.figures) == 2 and len(dash.figures[0].data) == len(GRID)
        assert "alert" in dash.status.value and dash.alert.table["baseline"].notna().any()
        assert len(dash.stored_outputs(png=False)) == 3
    finally:
        server.stop()
    assert not server.port_open()
    server.stop()  # idempotent


def test_profile_capacity_exercises_takeaways(tokenizer, tmp_path):
    model = ch08.serving_model()
    # A trace of its own: the panel's default path in the temp dir is shared with a concurrent nbval run of ch08.
    profile = ch08.ProfileLab(model, tokenizer, steps=3, trace_path=tmp_path / "trace.json")
    assert profile.profile.num_steps == 3 and profile.profile.trace_path.exists()
    assert 0.8 < profile.profile.coverage <= 1.05
    assert [caption for caption, _ in profile.stored_tables()] == ["time per range", "top operators by self CPU time"]
    capacity = ch08.CapacityLab(model, tokenizer)
    assert capacity.costs.prefill_ms_per_token > 0 and capacity.plan["chosen"].sum() <= 1
    capacity.itl_slo.value = 1000  # a lenient target: some batch is feasible
    assert capacity.plan["chosen"].sum() == 1
    ex = ch08.exercises(capacity)
    assert ex["rounding"].check(541) and not ex["rounding"].check(546)
    assert ex["batched"].check(math.ceil(10 / (1000 / (30 + 300 * 7.5)) * 1.2))
    rps = float(capacity.plan.loc[capacity.plan["chosen"], "rps_per_replica"].iloc[0])
    assert ex["replicas"].check(replicas_for(20, rps))
