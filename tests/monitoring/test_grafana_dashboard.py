"""The Grafana dashboard in datasets/grafana is importable as a dashboard and every PromQL expression in it names
only metrics that the workbench server's /metrics exports (read from a running server, after some traffic)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from monitoring_helpers import MODEL, tiny_engine, tiny_server
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parents[2] / "datasets" / "grafana" / "kv_workbench_serving.json"
METRIC = re.compile(r"vllm:[A-Za-z0-9_:]+")


def expressions(dashboard: dict) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


@pytest.fixture(scope="module")
def exported() -> set[str]:
    with tiny_server(tiny_engine(spec=True)) as server:
        body = {"model": MODEL, "prompt": "one two three one two three one two", "max_tokens": 6, "ignore_eos": True}
        assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).status_code == 200
        text = httpx.get(f"{server.url}/metrics").text
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def test_dashboard_shape():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["panels"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]) and panel["targets"], panel["title"]
        assert [t["refId"] for t in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "model_name"} <= variables


def problems(expr: str, exported: set[str]) -> list[str]:
    """What is wrong with one dashboard expression against the exported sample names (empty: nothing)."""
    names = METRIC.findall(expr)
    found = [] if names else ["names no vllm: metric"]
    found += [f"not exported: {name}" for name in sorted(set(names) - exported)]
    for name in re.findall(r"histogram_quantile\([^,]+,\s*sum by \(le\) \(rate\((vllm:[A-Za-z0-9_:]+)", expr):
        if not name.endswith("_bucket"):
            found.append(f"histogram_quantile over {name}, not a _bucket series")
    for name in re.findall(r"rate\((vllm:[A-Za-z0-9_:]+)", expr):
        if not name.endswith(("_total", "_bucket")):
            found.append(f"rate() over {name}, which is not a counter")
    return found


def test_every_expression_names_exported_metrics(exported):
    dashboard = json.loads(DASHBOARD.read_text())
    assert "vllm:time_to_first_token_seconds_bucket" in exported  # the scrape did read the server
    for expr in [*expressions(dashboard), dashboard["templating"]["list"][1]["definition"]]:
        assert problems(expr, exported) == [], expr


def test_the_check_catches_wrong_expressions(exported):
    # the seed's names (older vLLM: gpu_* became kv_* and prefix-cache counters, TPOT became ITL) are not
    # exported by this server, nor is a quantile over the histogram's name without _bucket, nor a gauge's rate
    assert problems("vllm:gpu_cache_usage_perc", exported) == ["not exported: vllm:gpu_cache_usage_perc"]
    assert "not exported: vllm:gpu_prefix_cache_hit_rate" in problems("avg(vllm:gpu_prefix_cache_hit_rate)", exported)
    assert problems("histogram_quantile(0.9, sum by (le) (rate(vllm:e2e_request_latency_seconds[5m])))", exported)
    assert problems("rate(vllm:num_requests_running[1m])", exported) == [
        "rate() over vllm:num_requests_running, which is not a counter"]
    assert problems("sum(up)", exported) == ["names no vllm: metric"]
