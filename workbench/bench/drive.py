"""Load drivers for chapter 5: the same workload, closed loop or open loop, on the local engine or any endpoint.

    run = drive(engine, workload, concurrency=8)              # closed loop: 8 users, next request on completion
    run = drive(engine, workload, request_rate=4.0, seed=0)   # open loop: seeded Poisson arrivals, 4 req/s
    run = drive("http://127.0.0.1:8000", workload, concurrency=8)   # the same, through workbench.bench

Against a URL the drive is `workbench.bench.run_benchmark` (HTTP, what a client sees). Against an ``LLMEngine``
the requests go in process, so queue time, preemptions and the per-step batch are visible too; the arrival
times come from the same `workbench.bench.LoadShape`, and both runs are summarized by the same
`workbench.bench.stats.summarize`, so their numbers mean the same thing. Per-request rows carry ``queue_s``
(engine only), ``ttft_s``, ``tpot_s`` and ``e2e_s``; a request's clock starts when the client sends it.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.bench.runner import LoadShape, run_benchmark
from workbench.bench.stats import parse_slo, summarize
from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.prompts import encode_prompt
from workbench.workloads import WorkloadRequest

MODES = ("static", "dynamic", "continuous")  # SchedulerConfig.batching


def batching_engine(model, tokenizer, batching: str, *, max_num_seqs: int = 16, num_blocks: int = 256,
                    block_size: int = 16, **scheduler) -> LLMEngine:
    """An engine over an already loaded model: building one costs only its KV pool (``num_blocks``)."""
    return LLMEngine(model, tokenizer, cache_config=CacheConfig(num_blocks=num_blocks, block_size=block_size),
                     scheduler_config=SchedulerConfig(batching=batching, max_num_seqs=max_num_seqs,
                                                      max_num_batched_tokens=max(512, max_num_seqs), **scheduler))


@dataclass(slots=True)
class LoadRun:
    requests: pd.DataFrame  # one row per request, in workload order
    summary: dict[str, float]  # workbench.bench.stats.summarize keys: output_throughput, ttft_p99_ms, goodput, ...
    steps: pd.DataFrame  # engine steps (empty for an HTTP endpoint)
    in_flight: list[int]  # requests in flight at each engine step (empty for an HTTP endpoint)
    load: str


def drive(target: LLMEngine | str, workload: list[WorkloadRequest], *, concurrency: int | None = None,
          request_rate: float | None = None, seed: int = 0, slo: str | dict[str, float] | None = None,
          progress: bool = False) -> LoadRun:
    """Run ``workload`` against an engine or an OpenAI-compatible URL (see the module docstring)."""
    if not workload:
        raise ValueError("the workload is empty")
    if isinstance(target, str):
        result = run_benchmark(target, workload, request_rate=request_rate, concurrency=concurrency, seed=seed,
                               slo=slo, progress=progress)
        frame = result.requests.rename(columns={"index": "workload_index"})
        return LoadRun(frame, result.summary, pd.DataFrame(), [], result.config["load"])
    if not isinstance(target, LLMEngine):
        raise ValueError(f"target must be an LLMEngine or a base URL string, got {type(target).__name__}")
    shape = LoadShape(request_rate, concurrency, seed)
    return _drive_engine(target, shape.arrivals(list(workload)), shape, parse_slo(slo))


def _drive_engine(engine: LLMEngine, timed: list[WorkloadRequest], shape: LoadShape,
                  slo_ms: dict[str, float]) -> LoadRun:
    engine.metrics.reset()
    limit = shape.concurrency or len(timed)
    pending = deque(sorted(range(len(timed)), key=lambda i: timed[i].arrival_s))
    index_of: dict[str, int] = {}
    in_flight: set[str] = set()
    counts: list[int] = []
    start = engine.clock()
    for _ in range(1_000_000):  # bounded: every step finishes or advances some request
        now = engine.clock()
        while pending and len(in_flight) < limit and start + timed[pending[0]].arrival_s <= now:
            index = pending.popleft()
            request = timed[index]
            # The client sends it now (closed loop, or an open loop held back by the cap), or at its arrival time.
            sent = now if shape.concurrency else start + request.arrival_s
            prompt = request.prompt
            if request.system is not None and isinstance(prompt, str):
                prompt = encode_prompt(engine.tokenizer, prompt, chat=True, system=request.system)
            rid = engine.add_request(prompt, request.sampling_params(), arrival_time=sent,
                                     priority=int(request.tags.get("priority", 0)))
            index_of[rid] = index
            in_flight.add(rid)
        if not in_flight and not pending:
            break
        if not in_flight:
            time.sleep(max(0.0, min(0.05, start + timed[pending[0]].arrival_s - engine.clock())))
            continue
        counts.append(len(in_flight))
        for output in engine.step():
            if output.finished:
                in_flight.discard(output.request_id)
    return _engine_run(engine, timed, index_of, counts, shape, slo_ms)


def _engine_run(engine: LLMEngine, timed: list[WorkloadRequest], index_of: dict[str, int], counts: list[int],
                shape: LoadShape, slo_ms: dict[str, float]) -> LoadRun:
    frame = engine.metrics.request_frame()
    frame.insert(0, "workload_index", frame["request_id"].map(index_of))
    frame = frame.sort_values("workload_index").reset_index(drop=True)
    frame["queue_s"] = frame["queue_time_s"]
    frame["success"] = True
    frame["index"] = frame["workload_index"]
    for key in sorted({k for r in timed for k in r.tags}):
        frame[key] = [timed[i].tags.get(key) for i in frame["workload_index"]]
    itl = engine.metrics.itl_frame()
    itl["index"] = itl["request_id"].map(index_of)
    duration = float(frame["finish"].max() - frame["arrival"].min())
    summary = summarize(frame, itl, duration, slo_ms)
    summary["queue_median_ms"] = float(np.nanmedian(frame["queue_s"])) * 1e3
    if slo_ms:
        from workbench.bench.stats import meets_slo

        frame["meets_slo"] = meets_slo(frame, slo_ms)
    return LoadRun(frame, summary, engine.metrics.step_frame(), counts, shape.describe())
