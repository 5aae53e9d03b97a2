"""The benchmark client's arithmetic on hand-made records (no server): TTFT/TPOT/ITL/e2e, throughput, goodput,
SLO parsing, load shapes and request bodies."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from workbench.bench.client import RequestRecord
from workbench.bench.payloads import endpoint_for, request_body
from workbench.bench.runner import LoadShape, base_url_of, repeat_to
from workbench.bench.stats import itl_rows, parse_slo, request_row, summarize
from workbench.workloads import WorkloadRequest


def _record(index: int, start: float, chunks: list[float], end: float, tokens: int, ok: bool = True) -> RequestRecord:
    return RequestRecord(index, "completions", start, success=ok, chunk_times=chunks, end_s=end,
                         output_tokens=tokens if ok else None, prompt_tokens=10 if ok else None)


def _frames(records):
    requests = pd.DataFrame([request_row(r) for r in records])
    itl = pd.DataFrame([row for r in records for row in itl_rows(r)], columns=["index", "chunk", "itl_s"])
    return requests, itl


def test_latencies_and_throughput_from_records():
    records = [_record(0, 0.0, [0.5, 0.7, 1.1], 1.2, tokens=3),  # TTFT 0.5, TPOT (1.1-0.5)/2 = 0.3
               _record(1, 1.0, [1.2, 1.3], 2.0, tokens=5),  # two chunks carrying five tokens: TPOT 0.1/4
               _record(2, 1.5, [], 1.6, tokens=0, ok=False)]
    requests, itl = _frames(records)
    assert requests.loc[0, "ttft_s"] == pytest.approx(0.5)
    assert requests.loc[0, "tpot_s"] == pytest.approx(0.3)
    assert requests.loc[1, "tpot_s"] == pytest.approx(0.1 / 4)
    assert requests.loc[1, "e2e_s"] == pytest.approx(1.0)
    assert sorted(itl["itl_s"].round(6)) == [0.1, 0.2, 0.4]
    summary = summarize(requests, itl, duration_s=2.0)
    assert (summary["completed"], summary["failed"]) == (2, 1)
    assert summary["output_throughput"] == pytest.approx(8 / 2.0)
    assert summary["request_throughput"] == pytest.approx(1.0)
    assert summary["total_token_throughput"] == pytest.approx((8 + 20) / 2.0)
    assert summary["ttft_mean_ms"] == pytest.approx(350.0)
    assert summary["ttft_median_ms"] == pytest.approx(350.0)
    assert summary["itl_p99_ms"] == pytest.approx(pd.Series([100, 200, 400]).quantile(0.99))
    assert summary["e2e_p90_ms"] == pytest.approx(pd.Series([1200.0, 1000.0]).quantile(0.9))


def test_goodput_counts_only_requests_within_every_slo():
    records = [_record(0, 0.0, [0.1, 0.2], 0.3, 2), _record(1, 0.0, [0.9, 1.0], 1.1, 2),
               _record(2, 0.0, [0.1, 0.9], 1.0, 2)]
    requests, itl = _frames(records)
    assert summarize(requests, itl, 1.0, parse_slo("ttft=500"))["good_requests"] == 2
    both = summarize(requests, itl, 2.0, parse_slo("ttft=500,tpot=200"))
    assert both["good_requests"] == 1 and both["goodput"] == pytest.approx(0.5)
    assert "goodput" not in summarize(requests, itl, 1.0)


def test_slo_parsing_refuses_bad_input():
    assert parse_slo({"e2e": 1000}) == {"e2e": 1000.0}
    assert parse_slo(None) == {}
    for bad, words in (("ttft", "name=milliseconds"), ("latency=5", "unknown SLO 'latency'"),
                       ("ttft=-1", "positive"), ("ttft=fast", "number of milliseconds"), ("tpot=nan", "positive")):
        with pytest.raises(ValueError, match=words):
            parse_slo(bad)


def test_load_shapes():
    workload = [WorkloadRequest("q", arrival_s=5.0) for _ in range(200)]
    assert [r.arrival_s for r in LoadShape(concurrency=4).arrivals(workload)] == [0.0] * 200
    assert LoadShape().arrivals(workload)[0].arrival_s == 5.0  # the workload's own clock
    poisson = LoadShape(request_rate=10.0, seed=1).arrivals(workload)
    gaps = pd.Series([b.arrival_s - a.arrival_s for a, b in zip(poisson, poisson[1:], strict=False)])
    assert gaps.min() >= 0 and 0.07 < gaps.mean() < 0.13  # exponential gaps with mean 1/rate
    assert all(r.arrival_s == 0 for r in LoadShape(request_rate=math.inf).arrivals(workload))
    for bad in (dict(request_rate=0), dict(request_rate=-1.0), dict(concurrency=0), dict(concurrency=2.5)):
        with pytest.raises(ValueError):
            LoadShape(**bad)
    assert "closed loop" in LoadShape(concurrency=3).describe()
    assert len(repeat_to(workload[:3], 7)) == 7
    assert base_url_of("http://h:8000/v1/") == "http://h:8000"


def test_request_bodies_follow_the_prompt_kind():
    text = WorkloadRequest("Hi", max_tokens=5, system="Be brief.", ignore_eos=True)
    ids = WorkloadRequest([1, 2, 3], max_tokens=4, temperature=0.7)
    assert endpoint_for(text) == "chat" and endpoint_for(ids) == "completions"
    chat = request_body(text, "m", "chat")
    assert chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert chat["ignore_eos"] and chat["stream_options"] == {"include_usage": True}
    completion = request_body(ids, "m", "completions", stream=False)
    assert completion["prompt"] == [1, 2, 3] and completion["seed"] == 0 and "stream_options" not in completion
    with pytest.raises(ValueError, match="token ids cannot go to the chat endpoint"):
        endpoint_for(ids, "chat")
    with pytest.raises(ValueError, match="endpoint must be one of"):
        endpoint_for(text, "embeddings")
