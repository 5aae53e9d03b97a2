"""One workload through a fleet under a routing policy, measured from both ends: what the clients saw (the same
load generator as ``workbench bench``, pointed at the router) and what each replica did (its own ``/metrics``,
read before and after, as a Prometheus scrape would).

- ``run_policy``: a fresh router with the policy over the running replicas, the tenant workload, then per
  replica: requests served, prompt tokens, prefix-cache hit rate (hit tokens over queried tokens, vLLM's
  counters); per request: TTFT, tokens read from the cache, the tenant.
- ``run_with_failure``: the same through a router while one replica is killed (SIGKILL) mid-run; every
  request ends one way or another (completed, cut mid-stream, refused), none waits forever, and the router's own
  counters say what it did (retries, circuit-breaker failures).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

import httpx
import pandas as pd

from workbench.bench.runner import run_benchmark, served_model
from workbench.fleet.launcher import Fleet
from workbench.fleet.replica import COUNTERS
from workbench.fleet.tenants import tenant_workload
from workbench.monitoring.scrape import parse_exposition


@dataclass(slots=True)
class PolicyRun:
    """What one policy did with one workload: ``requests`` (one row per request, with its tenant) and
    ``replicas`` (one row per replica: its share of the work and its prefix-cache hit rate)."""

    policy: str
    tenants: int
    users_per_tenant: int
    concurrency: int
    requests: pd.DataFrame
    replicas: pd.DataFrame
    summary: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        """Requests that completed (the TTFT percentiles are over these)."""
        return int(self.requests["success"].sum())

    @property
    def failed(self) -> int:
        return int((~self.requests["success"].astype(bool)).sum())

    @property
    def hit_rate(self) -> float:
        """The fleet's prefix-cache hit rate: hit tokens over queried tokens, summed over the replicas."""
        queries = self.replicas["prefix_queries"].sum()
        return float(self.replicas["prefix_hits"].sum() / queries) if queries else math.nan

    @property
    def ttft_p50_ms(self) -> float:
        return float(self.summary["ttft_median_ms"])

    @property
    def ttft_p90_ms(self) -> float:
        return float(self.summary["ttft_p90_ms"])

    @property
    def throughput(self) -> float:
        """Completed requests per second, first request sent to last one finished."""
        return float(self.summary["request_throughput"])

    @property
    def output_throughput(self) -> float:
        return float(self.summary["output_throughput"])

    @property
    def busiest_share(self) -> float:
        """The busiest replica's share of the requests (1 / replicas is an even split)."""
        total = self.replicas["requests"].sum()
        return float(self.replicas["requests"].max() / total) if total else math.nan

    def misses_per_tenant(self) -> pd.Series:
        """Per tenant: requests that read less than half their prompt from a replica's cache (the system prompt
        is most of every prompt, so these are the tenant's cold starts and evictions)."""
        ok = self.requests[self.requests["success"].astype(bool)]
        missed = ok["cached_tokens"].fillna(0) < ok["prompt_tokens"] / 2
        return missed.groupby(ok["tenant"]).sum().astype(int)

    def row(self) -> dict:
        return {"policy": self.policy, "tenants": self.tenants, "requests": len(self.requests), "n": self.n,
                "failed": self.failed, "hit_rate": self.hit_rate, "ttft_p50_ms": self.ttft_p50_ms,
                "ttft_p90_ms": self.ttft_p90_ms, "req_per_s": self.throughput,
                "output_tok_per_s": self.output_throughput, "busiest_share": self.busiest_share}


def counter_deltas(before: list[dict], after: list[dict]) -> pd.DataFrame:
    """Per replica: each counter's growth between two `Fleet.counters` readings, and the hit rate."""
    rows = []
    for b, a in zip(before, after, strict=True):
        row = {"replica": a["replica"]}
        row.update({key: a.get(key, math.nan) - b.get(key, math.nan) for key in COUNTERS})
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame["hit_rate"] = frame["prefix_hits"] / frame["prefix_queries"].where(frame["prefix_queries"] > 0)
    total = frame["requests"].sum()
    frame["share"] = frame["requests"] / total if total else math.nan
    return frame


def run_policy(fleet: Fleet, policy: str, *, tenants: int = 6, users_per_tenant: int = 4, concurrency: int = 4,
               sentences: int = 8, max_tokens: int = 4, run: int = 0, seed: int = 0) -> PolicyRun:
    """The tenant workload (numbered ``run``: its prompts share nothing with other runs') through a new router
    with ``policy``, in a closed loop of ``concurrency`` clients."""
    fleet.set_policy(policy)  # a fresh router: its prefix trees and counters start empty, as the replicas' do
    workload = tenant_workload(tenants, users_per_tenant, sentences=sentences, max_tokens=max_tokens, run=run,
                               seed=seed)
    model = served_model(fleet.url)
    before = fleet.counters()
    result = run_benchmark(fleet.url, workload, concurrency=concurrency, model=model, progress=False,
                           timeout_s=120.0)
    replicas = counter_deltas(before, fleet.counters())
    return PolicyRun(policy, tenants, users_per_tenant, concurrency, result.requests, replicas, result.summary)


# ---- a replica stopped mid-run --------------------------------------------------------------------------------
OUTCOMES = ("completed", "cut mid-stream", "refused", "failed before any token")
ROUTER_COUNTERS = {
    "retries": "vllm_router_retries_total",
    "retries_exhausted": "vllm_router_retries_exhausted_total",
    "worker_failures": "vllm_router_cb_outcomes_total",
}


@dataclass(slots=True)
class FailureRun:
    """A run during which replica ``killed`` was killed ``kill_s`` seconds after the first request was sent."""

    policy: str
    retries_enabled: bool
    killed: int
    kill_s: float
    requests: pd.DataFrame  # one row per request, with 'outcome' and 'when' (before / during / after the kill)
    router: dict[str, float]
    timeout_s: float
    killed_url: str = ""  # the killed replica's address, as the router's error messages name it

    @property
    def counts(self) -> dict[str, int]:
        return {o: int((self.requests["outcome"] == o).sum()) for o in OUTCOMES}

    @property
    def all_finished(self) -> bool:
        """Every request ended (completed or failed) within the client's timeout: nothing hung."""
        return bool(self.requests["end_s"].notna().all() and (self.requests["e2e_s"] < self.timeout_s).all())

    @property
    def longest_s(self) -> float:
        return float(self.requests["e2e_s"].max())

    def after_kill(self) -> pd.DataFrame:
        return self.requests[self.requests["start_s"] >= self.kill_s]

    def failed_on_the_dead_replica(self) -> pd.DataFrame:
        """Requests sent after the kill that failed with the router's own error naming the killed replica: the
        router's retries went back to it (its circuit breaker had not opened yet) until they were exhausted."""
        after = self.after_kill()
        errors = after["error"].fillna("").astype(str) if "error" in after else pd.Series("", index=after.index)
        return after[(after["outcome"] != "completed") & errors.str.contains(self.killed_url, regex=False)
                     & (self.killed_url != "")]


def classify(requests: pd.DataFrame) -> pd.Series:
    """Each request's outcome as its client saw it."""

    def one(row) -> str:
        if bool(row["success"]):
            return "completed"
        if row["status"] is not None and not pd.isna(row["status"]) and int(row["status"]) != 200:
            return "refused"
        return "cut mid-stream" if row["num_chunks"] > 0 else "failed before any token"

    return requests.apply(one, axis=1)


def router_counters(fleet: Fleet, worker: str | None = None) -> dict[str, float]:
    """The router's own counters (its Prometheus endpoint), summed over their labels (failures only, for
    ``worker_failures``); with ``worker``, also that worker's circuit-breaker state (``circuit_state``: 0 closed,
    1 open, 2 half-open) and health as the router sees it (``worker_healthy``: 1 or 0)."""
    text = httpx.get(fleet.router.metrics_url, timeout=5.0).text
    totals = dict.fromkeys(ROUTER_COUNTERS, 0.0)
    by_name = {name: key for key, name in ROUTER_COUNTERS.items()}
    per_worker = {"vllm_router_cb_state": "circuit_state", "vllm_router_worker_health": "worker_healthy"}
    for _at, name, _le, labels, value in parse_exposition(text, 0.0):
        key = by_name.get(name)
        if key == "worker_failures" and 'outcome="failure"' not in labels:
            continue
        if key is not None:
            totals[key] += value
        elif worker is not None and name in per_worker and f'worker="{worker}"' in labels:
            totals[per_worker[name]] = value
    return totals


def run_with_failure(fleet: Fleet, *, policy: str = "cache_aware", retries: bool = True, kill_at_s: float = 2.0,
                     replica: int = -1, tenants: int = 6, users_per_tenant: int = 3, request_rate: float = 4.0,
                     max_tokens: int = 16, run: int = 0, timeout_s: float = 60.0) -> FailureRun:
    """Requests arriving at ``request_rate`` per second (Poisson) through a new router with ``policy`` (router
    retries on or off); replica ``replica`` is killed with SIGKILL ``kill_at_s`` seconds in. Dead replicas are
    restarted first, so the run always starts with the whole fleet."""
    for index, rep in enumerate(fleet.replicas):
        if not rep.alive:
            fleet.restart_replica(index)
    fleet.set_policy(policy, router_args=() if retries else ("--disable-retries",))
    victim = fleet.replicas[replica]
    workload = tenant_workload(tenants, users_per_tenant, max_tokens=max_tokens, run=run)
    model = served_model(fleet.url)
    killed_at: list[float] = []
    start = time.perf_counter()

    def kill() -> None:
        time.sleep(kill_at_s)
        killed_at.append(time.perf_counter() - start)
        victim.crash()

    killer = threading.Thread(target=kill, name="kill-replica", daemon=True)
    killer.start()
    result = run_benchmark(fleet.url, workload, request_rate=request_rate, model=model, progress=False,
                           timeout_s=timeout_s)
    killer.join()
    requests = result.requests
    requests["outcome"] = classify(requests)
    kill_s = killed_at[0]
    requests["when"] = ["sent after the kill" if s >= kill_s else
                        ("under way at the kill" if e > kill_s else "done before the kill")
                        for s, e in zip(requests["start_s"], requests["end_s"], strict=True)]
    return FailureRun(policy, retries, victim.index, kill_s, requests, router_counters(fleet, victim.url), timeout_s,
                      victim.url)
