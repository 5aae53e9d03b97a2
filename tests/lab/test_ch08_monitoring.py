"""Chapter 8's lab, the server side: the seed's planning arithmetic, the load with its fault, the server the
notebook starts (and always stops), the dashboard panel over a live server, TPOT against ITL from its run, and
the Grafana check. The server runs the notebook's 2-layer serving model so this file stays fast."""

from __future__ import annotations

import pytest

from workbench.lab import ch08
from workbench.lab.ch08.panels import ALERT_TRACES, GRID, ITL, TPOT, latency_figure
from workbench.lab.ch08.runs import FAULTS
from workbench.lab.kit.figures import trace, trace_names

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: see tests/conftest.py


def test_seed_planning_and_prefill_floor():
    table = ch08.seed_planning()["value"]
    assert table["GPUs, exact"] == pytest.approx(540.36)
    assert (table["its code returns (round to nearest)"], table["its prose prints (rps rounded to 0.022 first)"],
            table["rounded up, as sizing must"]) == (540, 546, 541)
    floor = ch08.prefill_check()
    assert 400 < floor["floor_ms"] < 500 and floor["seed_over_peak"] > 8


def test_the_fault_is_a_burst_on_top_of_the_steady_load():
    steady, burst = ch08.dashboard_load(FAULTS[1]), ch08.dashboard_load(FAULTS[0])
    assert len(steady) == 60 and len(burst) == 76
    assert [len(r.prompt) for r in burst if r.tags["kind"] == "burst"] == [1500] * 16


def test_server_dashboard_latency_grafana_and_stop(tokenizer):
    server = ch08.serve(tokenizer)
    try:
        assert server.port_open() and "(random weights)" in ch08.model_label(ch08.serving_model())
        grafana = ch08.grafana_check(server.url)
        assert len(grafana) >= 10 and grafana["all exported"].all()
        dash = ch08.DashboardLab(server.url, "test", fault=FAULTS[0])
        assert not dash.measured  # measures when asked, not when built
        run = dash.run().result
        assert run.completed == 76 and run.failed == 0 and run.has_burst
        p = run.panels
        assert run.peak_waiting >= 1 and run.peak_kv_usage > 0.1 and p["running"].iloc[-1] == 0
        assert trace_names(dash.figures[0]) == list(GRID)
        assert set(trace_names(dash.figures[1])) == set(ALERT_TRACES)
        assert "alert" in dash.status.value and run.alert.table["baseline"].notna().any()
        assert len(dash.stored_outputs(png=False)) == 3
        latency = ch08.token_latency(run)
        # one TPOT per request with >= 2 tokens, one ITL per gap; no speculation: at most one token per chunk
        # (a chunk may hold two when the detokenizer waits for a whole character of the random model's bytes)
        assert len(latency.tpot_ms) == 76 and len(latency.itl_ms) > len(latency.tpot_ms)
        assert 0.9 < latency.chunks_per_token <= 1.0
        # a per-request average cannot exceed the request's largest gap: TPOT's max <= ITL's max
        assert latency.tpot_ms.max() <= latency.itl_ms.max() + 1e-6
        assert list(latency.stats().index) == ["TPOT (per request)", "ITL (per gap)"]
        fig = latency_figure(latency, "test")
        assert len(trace(fig, TPOT).x) == 76 and len(trace(fig, ITL).x) == len(latency.itl_ms)
    finally:
        server.stop()
    assert not server.port_open()
    server.stop()  # idempotent
