"""A real Prometheus (Debian's package: ``.ci/run`` installs it with apt-get, as it does Chromium) scrapes a live
``workbench serve`` under load, and every expression of the project's Grafana dashboard, and of the Grafana
dashboards vLLM ships as examples (datasets/grafana/vllm_example_dashboard_exprs.json), returns data from it: the
README's promise that dashboards written for vLLM read this server, checked with vLLM's own.

One live run serves both (a module fixture): Prometheus runs as a `workbench.fleet` child process (its own
process group, stopped with it, at exit too) on a free local port, with its own temporary storage and a
one-second scrape interval. Template variables are replaced as Grafana would replace them. Left out, each named
with its reason: our p99 TTFT against its own 1-hour baseline (offset 5 minutes: a test cannot wait an hour),
and the vLLM expressions over series this server does not have (VLLM_ABSENT, each with why: KV connectors and
offloading, the multimodal cache, LoRA, sleep mode, opt-in block-residency and FLOPs metrics).
All expressions are evaluated at one instant just after the traffic, as one dashboard refresh would be.
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

DATASETS = Path(__file__).resolve().parents[2] / "datasets" / "grafana"
DASHBOARD = DATASETS / "kv_workbench_serving.json"
VLLM_DASHBOARDS = DATASETS / "vllm_example_dashboard_exprs.json"
NEEDS_HISTORY = ("[1h] offset 5m",)
# Grafana's substitutions (the stored file's "substitutions" says why each value): $__rate_interval for a 1 s
# scrape, the served model for the model variables, the scrape job and target for $job and $instance (the target
# regex-escaped, as Grafana escapes a multi-value variable); each dashboard's default range and selected SLO
# thresholds come from the stored file's "fixed_substitutions".
OUR_VARIABLES = {"$__rate_interval": "10s", "$model_name": MODEL}
SCRAPE_JOB = "workbench"
_CONNECTOR = "a KV connector's series (disaggregated prefill, cross-instance or offloaded KV): this engine has none"
# Series vLLM's dashboards read that this server does not export, each with why; an expression over any of them is
# not asked (and the test checks that /metrics really has none of them, so this list cannot hide a series we have).
VLLM_ABSENT: dict[str, str] = {
    "vllm:external_prefix_cache_": _CONNECTOR + " (vLLM's own panel is empty without one: queries stay 0)",
    "vllm:num_requests_kv_fetch_by_stage": _CONNECTOR,
    "vllm:nixl_": _CONNECTOR + " (NixlConnector)",
    "vllm:kv_offload_": _CONNECTOR + " (OffloadingConnector)",
    "vllm:simple_kv_offload_": _CONNECTOR + " (SimpleCPUOffloadConnector)",
    "vllm:mm_cache_": "the multimodal input cache: this engine serves text-only models (vLLM's panel is empty for "
                      "them too)",
    "vllm:kv_block_": "sampled KV block residency (vLLM's opt-in --kv-cache-metrics): the engine does not sample "
                      "block lifetimes",
    "vllm:lora_requests_info": "LoRA adapters: this engine serves none (vLLM exports it only with LoRA enabled)",
    "vllm:sleep_mode_operation_duration_seconds": "sleep-mode API calls: this engine has no sleep mode",
    "vllm:rl_weight_update_operation_duration_seconds": "RL weight updates: this engine has no weight-update API",
    "vllm:estimated_": "estimated FLOPs and memory traffic (vLLM's opt-in --enable-mfu-metrics)",
}
PROMETHEUS = shutil.which("prometheus")

pytestmark = [pytest.mark.external,
              pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed (.ci/run "
                                                            "installs it: apt-get install prometheus)")]


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


def _query(prometheus: str, expr: str, at: float | None = None) -> list[dict]:
    """The instant query's result, evaluated at ``at`` (Unix seconds) if given, else now."""
    params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    reply = httpx.get(f"{prometheus}/api/v1/query", params=params, timeout=10).json()
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


def _absent(expr: str) -> list[str]:
    """The VLLM_ABSENT series ``expr`` reads."""
    return [name for name in VLLM_ABSENT if name in expr]


def _vllm_expressions() -> list[tuple[str, str, str, dict[str, str]]]:
    """(dashboard title, panel title, expression, the dashboard's fixed substitutions) for every expression of
    vLLM's example dashboards."""
    stored = json.loads(VLLM_DASHBOARDS.read_text())
    return [(dashboard["title"], panel["title"], expr, dashboard["fixed_substitutions"])
            for dashboard in stored["dashboards"] for panel in dashboard["panels"] for expr in panel["exprs"]]


@pytest.fixture(scope="module")
def live_answers(tmp_path_factory) -> dict:
    """One live run for every dashboard: a tiny server under a bounded loop of traffic, scraped by a real
    Prometheus each second, then every expression of our dashboard and of vLLM's example dashboards asked of
    it. {our expression, or (vLLM dashboard title, expression): Prometheus' result, and "/metrics": the server's
    own exposition}; the expressions left out are not asked."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the one_torch_thread fixture does (a module fixture cannot use it)
    ours = [t["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for t in panel["targets"]]
    theirs = [(title, expr, fixed) for title, _, expr, fixed in _vllm_expressions() if not _absent(expr)]
    try:
        with tiny_server(tiny_engine(spec=True)) as server:
            target = server.url.removeprefix("http://")
            prometheus_process, prometheus = _start_prometheus(target, tmp_path_factory.mktemp("prometheus"))
            grafana = {"$__rate_interval": "10s", "$model_name": MODEL, "$Deployment_id": MODEL,
                       "$job": SCRAPE_JOB, "$instance": target.replace(".", "\\\\."), "$engine": "0"}
            try:
                _wait_for(lambda: any(r["value"][1] == "1" for r in _query(prometheus, "up")), 60,
                          "the first scrape")
                body = {"model": MODEL, "prompt": "one two three one two three one two", "max_tokens": 8,
                        "ignore_eos": True, "temperature": 0}
                end = time.monotonic() + 6.0  # a bounded loop of traffic over several scrapes
                while time.monotonic() < end:
                    assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
                time.sleep(2.5)  # at least two scrapes after the last request
                # Every expression is evaluated at this one instant, as one dashboard refresh would be: a few
                # hundred queries take longer than a 10 s rate window, and the traffic has stopped.
                at = time.time()
                answers = {expr: _query(prometheus, _grafana(expr, OUR_VARIABLES), at)
                           for expr in ours if not any(marker in expr for marker in NEEDS_HISTORY)}
                answers.update({(title, expr): _query(prometheus, _grafana(expr, {**grafana, **fixed}), at)
                                for title, expr, fixed in theirs})
                answers["/metrics"] = httpx.get(f"{server.url}/metrics", timeout=10).text
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
    """vLLM's own example dashboards (the main one, the two statistics ones and the five vllm_* ones of
    examples/observability/dashboards/grafana) read this server: every expression returns at least one series with
    a finite value, except those over the series VLLM_ABSENT names, which /metrics indeed does not have."""
    stored = _vllm_expressions()
    assert len(stored) == 285, len(stored)  # the whole transcription: 27 + 21 + 14 + 84 + 17 + 10 + 36 + 76
    exported = {line.split("{")[0].split(" ")[0] for line in live_answers["/metrics"].splitlines()
                if line and not line.startswith("#")}
    assert not [name for name in exported if any(name.startswith(absent) for absent in VLLM_ABSENT)]
    left_out = [expr for _, _, expr, _ in stored if _absent(expr)]
    assert {name for expr in left_out for name in _absent(expr)} == set(VLLM_ABSENT), "an unused exclusion"
    failed = []
    for dashboard, panel, expr, _ in stored:
        if _absent(expr):
            continue
        values = [float(series["value"][1]) for series in live_answers[dashboard, expr]]
        if not values or not any(math.isfinite(v) for v in values):
            failed.append(f"{dashboard} / {panel}: {expr} -> {values}")
    assert not failed, "\n".join(failed)
    # Not only data, the right data where a panel maps values to words: the service-status board says Online (2).
    status = [e for d, p, e, _ in stored if d == "vLLM / Service Status" and p == "Status"][0]
    assert float(live_answers["vLLM / Service Status", status][0]["value"][1]) == 2
