"""The monitoring client against a live server (a 2-layer random-weight model behind the real HTTP server): the
dashboard's series come out of real scrapes, and the rate-of-change alert on p99 TTFT fires when a burst of
long prompts is injected, after the burst arrives, and stays quiet under the same steady load without it.

Why the rule holds for longer than its window: on a lightly loaded server the p99 of a 2 s window is nearly the
slowest request in it, and vLLM's TTFT buckets are coarse (0.1 s then 0.25 s), so one request that is a few
milliseconds slower can move p99 by 2-3x for as long as it stays in the window (seen here in steady runs). A
hold longer than the window needs the condition to outlast any single request; the burst's queue does. The
baseline ends 2 s (one window) back, so a queue that builds for seconds does not drag its own baseline up
with it (seen in a run where the burst's backlog lasted to the end: with no gap the ratio never held above 2).
"""

from __future__ import annotations

import math

import pytest
from monitoring_helpers import tiny_server

from workbench.monitoring.alerts import ChangeAlert
from workbench.monitoring.dashboard import PANELS, long_prompt_burst, panel_frame, steady_load, watch_load

WINDOW_S = 2.0
RULE = ChangeAlert("p99 TTFT doubled", factor=2.0, baseline_s=3.0, gap_s=2.0, hold_s=2.5)
BURST_AT_S = 5.0


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matrices: see tests/conftest.py


def run(fault: bool):
    load = steady_load(60, 6.0) + (long_prompt_burst(8, 1500, at_s=BURST_AT_S) if fault else [])
    with tiny_server() as server:
        watched = watch_load(server.url, load, interval_s=0.25)
    return watched, panel_frame(watched.samples, WINDOW_S)


@pytest.mark.slow
def test_alert_fires_on_a_long_prompt_burst_and_not_on_steady_load():
    watched, panels = run(fault=True)
    assert list(panels.columns) == list(PANELS)
    assert watched.bench.summary["completed"] == 68 and watched.bench.summary["failed"] == 0
    assert panels["waiting"].max() >= 2 and panels["kv_usage"].max() > 0.1  # the burst queued and filled the pool
    assert panels["generation_tokens_per_s"].max() > 0 and panels["running"].iloc[-1] == 0
    fired = RULE.evaluate(panels["ttft_p99_s"])
    burst_t = BURST_AT_S + watched.started_at - watched.samples["time"].min()  # on the panels' clock
    assert fired.fired and fired.fired_at >= burst_t, fired.table.to_string()

    _, steady = run(fault=False)
    quiet = RULE.evaluate(steady["ttft_p99_s"])
    assert not quiet.fired, quiet.table.to_string()


def test_capacity_from_a_measured_sweep():
    from workbench.monitoring.capacity import TrafficProfile, measure_sweep, plan_from_sweep

    workload = steady_load(10, 1.0, prompt_tokens=32, max_tokens=8)  # arrival times are replaced by each rate's
    with tiny_server() as server:
        sweep = measure_sweep(server.url, workload, rates=(2.0, 50.0))
    assert sweep["request_rate"].tolist() == [2.0, 50.0] and (sweep["failed"] == 0).all()
    assert sweep["request_throughput"].iloc[1] > sweep["request_throughput"].iloc[0]  # 10 requests sooner
    lenient = TrafficProfile(30.0, [32], [8], ttft_slo_s=60, itl_slo_s=60)
    plan = plan_from_sweep(lenient, sweep)
    assert plan["rps_per_replica"] == sweep["request_throughput"].max()
    assert plan["replicas"] >= 1 and plan["replicas"] == math.ceil(30.0 * 1.2 / plan["rps_per_replica"])
    impossible = TrafficProfile(30.0, [32], [8], ttft_slo_s=1e-6, itl_slo_s=1e-6)
    assert plan_from_sweep(impossible, sweep)["replicas"] == float("inf")
