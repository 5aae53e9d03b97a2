"""Load generation against any OpenAI-compatible endpoint: open loop, closed loop, or a workload's own clock.

    result = run_benchmark("http://127.0.0.1:8000", load_workload("mixed_short_long"), concurrency=8)
    result.requests        # one row per request (pandas), result.summary (dict), result.table() (ms)

Three load shapes (``LoadShape``):

- *open loop* (``request_rate=R``): requests are sent at Poisson arrival times with mean rate R per second,
  whether or not earlier ones have finished; queueing happens on the server, as with real users;
- *closed loop* (``concurrency=C``): C clients each send their next request when the previous one completes;
- neither: the workload's own ``arrival_s`` times (all at once for the files in ``datasets/workloads``).

``request_rate`` and ``concurrency`` together give an open loop capped at C requests in flight (vLLM's
``--max-concurrency``). The run happens on its own event loop (in a helper thread when the caller already
has one, as in Jupyter), so notebooks call it like any function.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pandas as pd
from tqdm.auto import tqdm

from workbench.bench.client import RequestRecord, send_request
from workbench.bench.payloads import PATHS, endpoint_for, request_body
from workbench.bench.stats import (
    DEFAULT_PERCENTILES,
    itl_rows,
    meets_slo,
    parse_slo,
    request_row,
    summarize,
    summary_table,
)
from workbench.workloads import WorkloadRequest, with_arrivals


@dataclass(frozen=True, slots=True)
class LoadShape:
    request_rate: float | None = None  # requests per second (Poisson); None: the workload's own arrival times
    concurrency: int | None = None  # most requests in flight; None: unbounded
    seed: int = 0  # of the Poisson arrivals

    def __post_init__(self) -> None:
        rate = self.request_rate
        if rate is not None and not (isinstance(rate, int | float) and rate > 0 and not math.isnan(rate)):
            raise ValueError(f"request_rate must be a number > 0 (or inf, or None), got {rate!r}")
        if self.concurrency is not None and not (isinstance(self.concurrency, int) and self.concurrency >= 1):
            raise ValueError(f"concurrency must be an integer >= 1 or None, got {self.concurrency!r}")

    def arrivals(self, workload: list[WorkloadRequest]) -> list[WorkloadRequest]:
        if self.request_rate is not None:
            return with_arrivals(workload, None if math.isinf(self.request_rate) else self.request_rate, self.seed)
        if self.concurrency is not None:  # closed loop: everyone is ready at once, the limit paces them
            return with_arrivals(workload, None)
        return workload

    def describe(self) -> str:
        rate = "workload times" if self.request_rate is None else f"{self.request_rate:g} req/s Poisson"
        if self.concurrency is not None and self.request_rate is None:
            return f"closed loop, concurrency {self.concurrency}"
        return rate + (f", at most {self.concurrency} in flight" if self.concurrency else "")


@dataclass(slots=True)
class ServingBenchResult:
    requests: pd.DataFrame  # one row per request, in workload order
    itl: pd.DataFrame  # one row per gap between chunks
    summary: dict[str, float]
    config: dict = field(default_factory=dict)

    def table(self) -> pd.DataFrame:
        """TTFT / TPOT / ITL / e2e in ms: mean, median, p90, p99."""
        return summary_table(self.summary)

    def save(self, path: str | Path) -> Path:
        """Per-request rows as CSV (``.csv``) or JSON records (``.json``, with the summary and config)."""
        path = Path(path)
        if path.suffix == ".csv":
            self.requests.to_csv(path, index=False)
        elif path.suffix == ".json":
            rows = json.loads(self.requests.to_json(orient="records"))
            path.write_text(json.dumps({"config": self.config, "summary": self.summary, "requests": rows}, indent=1))
        else:
            raise ValueError(f"save to a .csv or .json path, got {str(path)!r}")
        return path


def base_url_of(url: str) -> str:
    """``http://host:port`` from either that or ``http://host:port/v1``."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def served_model(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> str:
    """The first model a server lists at /v1/models."""
    response = httpx.get(f"{base_url_of(base_url)}/v1/models", headers=_auth(api_key), timeout=timeout_s)
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise ValueError(f"{base_url} lists no models")
    return models[0]["id"]


def run_benchmark(base_url: str, workload: list[WorkloadRequest], *, request_rate: float | None = None,
                  concurrency: int | None = None, seed: int = 0, model: str | None = None,
                  api_key: str | None = None, slo: str | dict[str, float] | None = None, endpoint: str = "auto",
                  stream: bool = True, progress: bool = True, timeout_s: float = 600.0,
                  percentiles: tuple[int, ...] = DEFAULT_PERCENTILES) -> ServingBenchResult:
    """Send ``workload`` to the server at ``base_url`` and measure every request (see the module docstring)."""
    if not workload:
        raise ValueError("the workload is empty")
    shape = LoadShape(request_rate, concurrency, seed)
    slo_ms = parse_slo(slo)
    base = base_url_of(base_url)
    model = model or served_model(base, api_key)
    timed = shape.arrivals(list(workload))
    kinds = [endpoint_for(r, endpoint) for r in timed]
    bodies = [request_body(r, model, kind, stream=stream) for r, kind in zip(timed, kinds, strict=True)]
    records, duration = _in_own_loop(_drive(base, timed, kinds, bodies, shape, _auth(api_key), timeout_s, progress))
    requests = pd.DataFrame([request_row(r) for r in records])
    # vLLM's client_queue_time: how long a request waited for a free slot (--concurrency) after its arrival time
    requests["client_queue_s"] = [max(0.0, r.start_s - timed[r.index].arrival_s) for r in records]
    requests["text"] = [r.text for r in records]
    for key in sorted({k for r in timed for k in r.tags}):
        requests[key] = [r.tags.get(key) for r in timed]
    if slo_ms:
        requests["meets_slo"] = meets_slo(requests, slo_ms)
    itl = pd.DataFrame([row for r in records for row in itl_rows(r)], columns=["index", "chunk", "itl_s"])
    config = {"base_url": base, "model": model, "load": shape.describe(), "num_requests": len(timed),
              "request_rate": "inf" if request_rate is None else request_rate, "concurrency": concurrency,
              "stream": stream, "slo_ms": slo_ms, "percentiles": list(percentiles)}
    return ServingBenchResult(requests, itl, summarize(requests, itl, duration, slo_ms, percentiles), config)


def _in_own_loop(coroutine):
    """Run a coroutine to completion, also from inside a running event loop (Jupyter)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def _drive(base: str, timed: list[WorkloadRequest], kinds: list[str], bodies: list[dict], shape: LoadShape,
                 headers: dict[str, str], timeout_s: float, progress: bool) -> tuple[list[RequestRecord], float]:
    order = sorted(range(len(timed)), key=lambda i: timed[i].arrival_s)
    limit = asyncio.Semaphore(shape.concurrency) if shape.concurrency else None
    records: list[RequestRecord | None] = [None] * len(timed)
    client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=httpx.Limits(max_connections=None,
                                                                                      max_keepalive_connections=None))
    bar = tqdm(total=len(timed), desc="bench", unit="req", disable=not progress)

    async def one(index: int, t0: float) -> None:
        try:
            record = RequestRecord(index, kinds[index], time.perf_counter() - t0)
            records[index] = await send_request(client, base + PATHS[kinds[index]], bodies[index], record, t0,
                                                headers)
            bar.update(1)
        finally:
            if limit is not None:
                limit.release()

    async with client:
        t0 = time.perf_counter()
        tasks = []
        for index in order:
            delay = t0 + timed[index].arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if limit is not None:
                await limit.acquire()
            tasks.append(asyncio.create_task(one(index, t0)))
        await asyncio.gather(*tasks)
    bar.close()
    done = [r for r in records if r is not None]
    first = min(r.start_s for r in done)
    last = max(r.end_s for r in done if r.end_s is not None)
    return done, last - first


def repeat_to(workload: list[WorkloadRequest], count: int) -> list[WorkloadRequest]:
    """The first ``count`` requests, cycling through the workload when it is shorter."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"the number of requests must be an integer >= 1, got {count!r}")
    return [workload[i % len(workload)] for i in range(count)]
