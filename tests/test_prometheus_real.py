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
from monitoring_helpers import MODEL, tiny_engine, tiny_server

from workbench.fleet.processes import ChildProcess, free_port

DASHBOARD = Path(__file__).resolve().parents[1] / "datasets" / "grafana" / "kv_workbench_serving.json"
NEEDS_HISTORY = ("[1h] offset 5m",)
PROMETHEUS = shutil.which("prometheus")

pytestmark = [pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed (.ci/run "
                                                            "installs it: apt-get install prometheus)"),
              pytest.mark.usefixtures("one_torch_thread")]


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


def test_every_dashboard_expression_returns_data_from_a_real_prometheus(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    with tiny_server(tiny_engine(spec=True)) as server:
        prometheus_process, prometheus = _start_prometheus(server.url.removeprefix("http://"), tmp_path)
        try:
            _wait_for(lambda: any(r["value"][1] == "1" for r in _query(prometheus, "up")), 60, "the first scrape")
            body = {"model": MODEL, "prompt": "one two three one two three one two", "max_tokens": 8,
                    "ignore_eos": True, "temperature": 0}
            end = time.monotonic() + 6.0  # a bounded loop of traffic over several scrapes
            while time.monotonic() < end:
                assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
            time.sleep(2.5)  # at least two scrapes after the last request
            answered, skipped = {}, []
            for expr in expressions:
                if any(marker in expr for marker in NEEDS_HISTORY):
                    skipped.append(expr)
                    continue
                query = expr.replace("$__rate_interval", "10s").replace("$model_name", MODEL)
                answered[expr] = _query(prometheus, query)
        finally:
            prometheus_process.close()
    assert len(skipped) == 1, skipped
    empty = [expr for expr, result in answered.items() if not result]
    assert not empty, f"no data from Prometheus for: {empty}"
    ttft = [e for e in answered if "time_to_first_token" in e and "0.5," in e][0]
    assert math.isfinite(float(answered[ttft][0]["value"][1]))
