"""Driving an engine with a workload and collecting what it measured.

``run_workload`` replays a workload against an ``LLMEngine``: with ``realtime=True`` each request is added
when the wall clock reaches its arrival time (so queueing is real), otherwise all arrive at once. It returns
the engine's per-request and per-step frames plus summary percentiles and throughput, restricted to this run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd
from tqdm.auto import tqdm

from workbench.engine.llm_engine import LLMEngine
from workbench.prompts import encode_prompt
from workbench.workloads import WorkloadRequest


@dataclass(slots=True)
class BenchResult:
    requests: pd.DataFrame  # one row per sequence, in workload order: timeline, TTFT, TPOT, e2e, tags, ...
    itl: pd.DataFrame  # one row per output token after the first
    steps: pd.DataFrame  # one row per engine step
    summary: pd.DataFrame  # p50/p95/p99/mean in ms
    throughput: dict[str, float]
    wall_s: float


def run_workload(engine: LLMEngine, workload: list[WorkloadRequest], *, realtime: bool = True,
                 progress: bool = True, chat: bool = True) -> BenchResult:
    if not workload:
        raise ValueError("the workload is empty")
    engine.metrics.reset()
    pending = sorted(range(len(workload)), key=lambda i: workload[i].arrival_s)
    start = engine.clock()
    index_of: dict[str, int] = {}
    with tqdm(total=len(workload), desc="workload", unit="req", disable=not progress) as bar:
        while pending or engine.has_unfinished_requests():
            now = engine.clock()
            while pending and (not realtime or start + workload[pending[0]].arrival_s <= now):
                index = pending.pop(0)
                request = workload[index]
                prompt = request.prompt
                if request.system is not None and isinstance(prompt, str):
                    prompt = encode_prompt(engine.tokenizer, prompt, chat=True, system=request.system)
                arrival = start + request.arrival_s if realtime else now
                rid = engine.add_request(prompt, request.sampling_params(), arrival_time=arrival, chat=chat)
                index_of[rid] = index
            if not engine.step() and pending and not engine.has_unfinished_requests():
                time.sleep(max(0.0, min(0.01, start + workload[pending[0]].arrival_s - engine.clock())))
            bar.update(len(engine.metrics.finished) - bar.n)
    wall = engine.clock() - start
    metrics = engine.metrics
    requests = metrics.request_frame()
    requests.insert(0, "workload_index", requests["request_id"].map(index_of))
    for key in sorted({k for r in workload for k in r.tags}):
        requests[key] = [workload[i].tags.get(key) for i in requests["workload_index"]]
    requests = requests.sort_values(["workload_index", "seq_id"]).reset_index(drop=True)
    return BenchResult(requests, metrics.itl_frame(), metrics.step_frame(), metrics.summary(), metrics.throughput(),
                       wall)
