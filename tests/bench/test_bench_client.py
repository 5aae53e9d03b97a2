"""The load generator against a real server: per-request rows that agree with the server's own records,
closed loops that respect their concurrency, open loops that follow their arrival times, failures counted,
results saved as CSV/JSON, and the API usable from inside a running event loop (Jupyter)."""

from __future__ import annotations

import asyncio
import json

import pandas as pd
import pytest
from serve_helpers import MODEL, make_engine, on_engine, running_server, wait_idle

from workbench.bench import run_benchmark
from workbench.serve.generation import response_id_of
from workbench.workloads import WorkloadRequest, mixed_lengths


@pytest.fixture(scope="module")
def server(real_model, tokenizer):
    with running_server(make_engine(real_model, tokenizer)) as server:
        yield server


def _max_in_flight(requests: pd.DataFrame) -> int:
    events = sorted([(t, 1) for t in requests["start_s"]] + [(t, -1) for t in requests["end_s"]],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def test_closed_loop_rows_agree_with_server(server):
    workload = mixed_lengths(8, prompt_tokens=(4, 32), output_tokens=(3, 10), seed=5)
    result = run_benchmark(server.url, workload, concurrency=3, progress=False, slo={"ttft": 1e7, "tpot": 1e7})
    rows = result.requests
    assert len(rows) == 8 and rows["success"].all() and list(rows["index"]) == list(range(8))
    assert list(rows["output_tokens"]) == [r.max_tokens for r in workload]  # ignore_eos: exact lengths
    assert list(rows["prompt_tokens"]) == [len(r.prompt) for r in workload]
    assert _max_in_flight(rows) <= 3
    assert (rows["ttft_s"] <= rows["e2e_s"]).all() and (rows["ttft_s"] > 0).all()
    assert rows["meets_slo"].all() and result.summary["good_requests"] == 8

    wait_idle(server)
    served = on_engine(server, lambda engine: engine.metrics.request_frame())
    served.index = served["request_id"].map(response_id_of)
    for row in rows.itertuples():
        server_row = served.loc[row.request_id]
        assert server_row["output_tokens"] == row.output_tokens
        # The client's TTFT includes HTTP on top of what the engine measured from arrival.
        assert row.ttft_s >= server_row["ttft_s"] - 0.005

    s = result.summary
    assert s["completed"] == 8 and s["failed"] == 0
    assert s["output_throughput"] == pytest.approx(rows["output_tokens"].sum() / s["duration_s"])
    assert s["duration_s"] == pytest.approx(rows["end_s"].max() - rows["start_s"].min())
    table = result.table()
    assert list(table.index) == ["ttft", "tpot", "itl", "e2e"]
    assert list(table.columns) == ["mean", "median", "p90", "p99"]
    assert (table["p99"] >= table["median"]).all()


def test_open_loop_follows_poisson_arrivals_and_counts_failures(server, tmp_path):
    workload = [WorkloadRequest([100 + i, 200, 300], max_tokens=2, ignore_eos=True) for i in range(6)]
    workload.append(WorkloadRequest([5, 6, 7], max_tokens=9000))  # past the context: the server refuses it
    result = run_benchmark(server.url, workload, request_rate=4.0, seed=2, progress=False, slo="e2e=1e7")
    rows = result.requests
    assert result.summary["completed"] == 6 and result.summary["failed"] == 1
    failed = rows[~rows["success"]].iloc[0]
    assert failed["status"] == 400 and "maximum context length" in failed["error"]
    assert result.summary["good_requests"] == 6  # a failed request is never good
    starts = rows.sort_values("index")["start_s"].to_numpy()
    assert starts[-1] > 0.3  # seven arrivals at 4 per second are spread out, not sent at once
    assert result.config["load"] == "4 req/s Poisson"

    csv = pd.read_csv(result.save(tmp_path / "rows.csv"))
    assert list(csv["output_tokens"].fillna(-1)) == list(rows["output_tokens"].fillna(-1))
    saved = json.loads(result.save(tmp_path / "rows.json").read_text())
    assert saved["summary"]["failed"] == 1 and len(saved["requests"]) == 7
    with pytest.raises(ValueError, match=".csv or .json"):
        result.save(tmp_path / "rows.txt")


def test_chat_workload_whole_responses_and_inside_an_event_loop(server):
    workload = [WorkloadRequest("Say hello.", max_tokens=4, system="Be brief."),
                WorkloadRequest("Name a fruit.", max_tokens=4)]

    async def from_a_notebook_cell():  # Jupyter runs cells inside an event loop
        return run_benchmark(server.url, workload, stream=False, model=MODEL, progress=False)

    result = asyncio.run(from_a_notebook_cell())
    rows = result.requests
    assert rows["success"].all() and (rows["endpoint"] == "chat").all()
    # A whole response arrives at once: its first "chunk" is the response, so TTFT is (about) e2e.
    assert ((rows["e2e_s"] - rows["ttft_s"]).between(0, 0.5)).all()
    assert (rows["output_tokens"] <= 4).all() and (rows["num_chunks"] == 1).all()
