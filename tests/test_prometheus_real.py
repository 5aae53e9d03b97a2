"""A real Prometheus (Debian's package: ``.ci/run`` installs it with apt-get, as it does Chromium) scrapes a live
``workbench serve`` under load, and every expression of the project's Grafana dashboard, and of the Grafana
dashboards vLLM ships as examples (datasets/grafana/vllm_example_dashboard_exprs.json), returns data from it: the
README's promise that dashboards written for vLLM read this server, checked with vLLM's own.

One live run serves both (a module fixture): Prometheus runs as a `workbench.fleet` child process (its own
process group, stopped with it, at exit too) on a free local port, with its own temporary storage and a
one-second scrape interval. Template variables are replaced as Grafana would replace them. Left out, each named
with its reason: our p99 TTFT against its own 1-hour baseline (offset 5 minutes: a test cannot wait an hour),
and the vLLM expressions over series this server does not have (VLLM_EXCLUDED: HTTP route metrics, a KV
connector's cache, the multimodal cache).
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
# scrape, the served model for the model variables, the scrape job and target for $job and $instance (the target
# regex-escaped, as Grafana escapes a multi-value variable); each dashboard's default range and selected SLO
# thresholds come from the stored file's "fixed_substitutions".
OUR_VARIABLES = {"$__rate_interval": "10s", "$model_name": MODEL}
SCRAPE_JOB = "workbench"
_HTTP = "vLLM's API server HTTP metrics (prometheus-fastapi-instrumentator), not engine series: workbench serve " \
        "does not instrument its HTTP routes"
# vLLM example expressions this test does not ask, each with why.
VLLM_EXCLUDED: dict[str, str] = {
    '(sum(rate(http_requests_total{job=~"$job", instance=~"$instance", status="5xx"}[$__rate_interval])) or '
    'vector(0)) / (sum(rate(http_requests_total{job=~"$job", instance=~"$instance"}[$__rate_interval])) > 0)': _HTTP,
    'sum by (status) (rate(http_requests_total{job=~"$job", instance=~"$instance"}[$__rate_interval]))': _HTTP,
    'sum by (handler) (rate(http_requests_total{job=~"$job", instance=~"$instance"}[$__rate_interval]))': _HTTP,
    'sum by (handler) (rate(http_request_duration_seconds_sum{job=~"$job", instance=~"$instance"}'
    '[$__rate_interval])) / (sum by (handler) (rate(http_request_duration_seconds_count{job=~"$job", '
    'instance=~"$instance"}[$__rate_interval])) > 0)': _HTTP,
    'sum(rate(vllm:external_prefix_cache_hits_total{job=~"$job", model_name=~"$model_name", instance=~"$instance"}'
    '[$__rate_interval])) / (sum(rate(vllm:external_prefix_cache_queries_total{job=~"$job", '
    'model_name=~"$model_name", instance=~"$instance"}[$__rate_interval])) > 0)':
        "a KV connector's cross-instance cache: this engine has no KV connector (vLLM registers the series only "
        "when one is configured)",
    'sum(rate(vllm:mm_cache_hits_total{job=~"$job", model_name=~"$model_name", instance=~"$instance"}'
    '[$__rate_interval])) / (sum(rate(vllm:mm_cache_queries_total{job=~"$job", model_name=~"$model_name", '
    'instance=~"$instance"}[$__rate_interval])) > 0)':
        "the multimodal input cache: this engine serves text-only models",
}
PROMETHEUS = shutil.which("prometheus")

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed (.ci/run "
                                                          "installs it: apt-get install prometheus)")


def _start_prometheus(target: str, folder: Path) -> tuple[ChildProcess, str]:
    """Prometheus in its own process group (stopped with it, at exit too), on a free port, ready to query."""
    url = f"http://127.0.0.1:{free_port()}"
    config = folder / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                      f"  - job_name: {SCRAPE_JOB}\n    static_configs:\n      - targets: ['{target}']\n")
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


def _vllm_expressions() -> list[tuple[str, str, str, dict[str, str]]]:
    """(dashboard title, panel title, expression, the dashboard's fixed substitutions) for every expression of
    vLLM's example dashboards."""
    stored = json.loads(VLLM_DASHBOARDS.read_text())
    return [(dashboard["title"], panel["title"], expr, dashboard["fixed_substitutions"])
            for dashboard in stored["dashboards"] for panel in dashboard["panels"] for expr in panel["exprs"]]


@pytest.fixture(scope="module")
def live_answers(tmp_path_factory) -> dict[str | tuple[str, str], list[dict]]:
    """One live run for every dashboard: a tiny server under a bounded loop of traffic, scraped by a real
    Prometheus each second, then every expression of our dashboard and of vLLM's example dashboards asked of
    it. {our expression, or (vLLM dashboard title, expression): Prometheus' result}; the expressions left out
    are not asked."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the one_torch_thread fixture does (a module fixture cannot use it)
    ours = [t["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for t in panel["targets"]]
    theirs = [(title, expr, fixed) for title, _, expr, fixed in _vllm_expressions() if expr not in VLLM_EXCLUDED]
    try:
        with tiny_server(tiny_engine(spec=True)) as server:
            target = server.url.removeprefix("http://")
            prometheus_process, prometheus = _start_prometheus(target, tmp_path_factory.mktemp("prometheus"))
            grafana = {"$__rate_interval": "10s", "$model_name": MODEL, "$Deployment_id": MODEL,
                       "$job": SCRAPE_JOB, "$instance": target.replace(".", "\\\\.")}
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
                answers.update({(title, expr): _query(prometheus, _grafana(expr, {**grafana, **fixed}))
                                for title, expr, fixed in theirs})
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
    """vLLM's own example dashboards (the main one, the two statistics ones and the overview) read this server:
    every expression returns at least one series with a finite value, except those VLLM_EXCLUDED names."""
    stored = _vllm_expressions()
    assert len(stored) >= 146, len(stored)  # the transcription is whole: 27 + 21 + 14 + 84 expressions
    assert set(VLLM_EXCLUDED) <= {expr for _, _, expr, _ in stored}, "an exclusion names no stored expression"
    failed = []
    for dashboard, panel, expr, _ in stored:
        if expr in VLLM_EXCLUDED:
            continue
        values = [float(series["value"][1]) for series in live_answers[dashboard, expr]]
        if not values or not any(math.isfinite(v) for v in values):
            failed.append(f"{dashboard} / {panel}: {expr} -> {values}")
    assert not failed, "\n".join(failed)
