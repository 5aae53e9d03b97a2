"""A real Prometheus (Debian's package: ``.ci/run`` installs it with apt-get, as it does Chromium) scrapes a live
``workbench serve`` under load, and every expression of the project's Grafana dashboard returns data from it.

Prometheus runs as a `workbench.fleet` child process (its own process group, stopped with it, at exit too) on a
free local port, with its own temporary storage and a one-second scrape interval. The one expression that needs
an hour of history (the p99 TTFT against its own 1-hour baseline, offset 5 minutes) is named and left out: a test
cannot wait an hour.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import httpx
import pytest
import torch
from monitoring_helpers import MODEL, tiny_engine, tiny_server

from workbench.fleet.processes import ChildProcess, free_port

DATASETS = Path(__file__).resolve().parents[1] / "datasets" / "grafana"
DASHBOARD = DATASETS / "kv_workbench_serving.json"
VLLM_DASHBOARDS = DATASETS / "vllm_example_dashboard_exprs.json"
NEEDS_HISTORY = ("[1h] offset 5m",)
# Grafana's substitutions (the stored file's "substitutions" says why each value): $__rate_interval for a 1 s
# scrape, the served model for the model variables, the dashboards' default 12-hour range for $__range.
OUR_VARIABLES = {"$__rate_interval": "10s", "$model_name": MODEL}
VLLM_VARIABLES = {"$__rate_interval": "10s", "$model_name": MODEL, "$Deployment_id": MODEL, "$__range": "12h"}
# vLLM example expressions this test does not ask, each with why (none: every one returns data).
VLLM_EXCLUDED: dict[str, str] = {}
PROMETHEUS = shutil.which("prometheus")

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed (.ci/run "
                                                          "installs it: apt-get install prometheus)")


def _start_prometheus(target: str, folder: Path) -> tuple[ChildProcess, str]:
    """Prometheus in its own process group (stopped with it, at exit too), on a free port, ready to query."""
    url = f"http://127.0.0.1:{free_port()}"
    config = folder / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                      f"  - job_name: workbench\n    static_configs:\n      - targets: ['{target}']\n")
    process = ChildProcess("prometheus", [
        PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address={url.removeprefix('http://')}", "--log.level=warn"]).start()
    try:
        process.wait_http(f"{url}/-/ready", time.monotonic() + 60)
    except BaseException:
        process.close()
        raise
    return process, url


def _query(prometheus: str, expr: str) -> list[dict]:
    reply = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert reply["status"] == "success", (expr, reply)
    return reply["data"]["result"]


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _grafana(expr: str, values: dict[str, str]) -> str:
    """``expr`` as Grafana sends it: its template variables replaced, longest name first ($__range_s before
    $__range)."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(name, values[name])
    return expr


def _vllm_expressions() -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, expression) for every expression of vLLM's example dashboards."""
    stored = json.loads(VLLM_DASHBOARDS.read_text())
    return [(dashboard["title"], panel["title"], expr) for dashboard in stored["dashboards"]
            for panel in dashboard["panels"] for expr in panel["exprs"]]


@pytest.fixture(scope="module")
def live_answers(tmp_path_factory) -> dict[str, list[dict]]:
    """One live run for every dashboard: a tiny server under a bounded loop of traffic, scraped by a real
    Prometheus each second, then every expression of our dashboard and of vLLM's example dashboards asked of
    it. {expression as stored: Prometheus' result}; the expressions left out are not asked."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the one_torch_thread fixture does (a module fixture cannot use it)
    ours = [t["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for t in panel["targets"]]
    theirs = [expr for _, _, expr in _vllm_expressions() if expr not in VLLM_EXCLUDED]
    try:
        with tiny_server(tiny_engine(spec=True)) as server:
            prometheus_process, prometheus = _start_prometheus(server.url.removeprefix("http://"),
                                                               tmp_path_factory.mktemp("prometheus"))
            try:
                _wait_for(lambda: any(r["value"][1] == "1" for r in _query(prometheus, "up")), 60,
                          "the first scrape")
                body = {"model": MODEL, "prompt": "one two three one two three one two", "max_tokens": 8,
                        "ignore_eos": True, "temperature": 0}
                end = time.monotonic() + 6.0  # a bounded loop of traffic over several scrapes
                while time.monotonic() < end:
                    assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
                time.sleep(2.5)  # at least two scrapes after the last request
                answers = {expr: _query(prometheus, _grafana(expr, OUR_VARIABLES))
                           for expr in ours if not any(marker in expr for marker in NEEDS_HISTORY)}
                answers.update({expr: _query(prometheus, _grafana(expr, VLLM_VARIABLES)) for expr in theirs})
            finally:
                prometheus_process.close()
    finally:
        torch.set_num_threads(threads)
    return answers


def test_every_dashboard_expression_returns_data_from_a_real_prometheus(live_answers):
    expressions = [t["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for t in panel["targets"]]
    skipped = [expr for expr in expressions if expr not in live_answers]
    assert len(skipped) == 1 and NEEDS_HISTORY[0] in skipped[0], skipped
    empty = [expr for expr in expressions if expr in live_answers and not live_answers[expr]]
    assert not empty, f"no data from Prometheus for: {empty}"
    ttft = [e for e in expressions if "time_to_first_token" in e and "0.5," in e][0]
    assert math.isfinite(float(live_answers[ttft][0]["value"][1]))


def test_every_vllm_example_dashboard_expression_returns_data(live_answers):
    """vLLM's own example dashboards (the main one and the two statistics ones) read this server: every
    expression returns at least one series with a finite value, except those named in VLLM_EXCLUDED."""
    stored = _vllm_expressions()
    assert len(stored) >= 60, len(stored)  # the transcription is whole: 27 + 21 + 14 expressions
    assert set(VLLM_EXCLUDED) <= {expr for _, _, expr in stored}, "an exclusion names no stored expression"
    failed = []
    for dashboard, panel, expr in stored:
        if expr in VLLM_EXCLUDED:
            continue
        values = [float(series["value"][1]) for series in live_answers[expr]]
        if not values or not any(math.isfinite(v) for v in values):
            failed.append(f"{dashboard} / {panel}: {expr} -> {values}")
    assert not failed, "\n".join(failed)
