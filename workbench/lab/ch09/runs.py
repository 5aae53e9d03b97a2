"""Chapter 9's measurements, without widgets: the chapter's fleet and workload, the policies side by side, the
number of tenants against what the replicas' caches hold, a replica killed mid-run, and the scrapes.

The fleet is sized to a 2-core CPU: two replicas of the real model (fp32, one core and one thread each), each
with a 64-block KV pool (1,024 tokens), so one replica's prefix cache holds the system prompts of about four
tenants. Answers are 4 tokens long (16 in the failure run, so that streams are under way when the replica dies):
the lesson is where prompts go, not the text. Every run uses prompts no earlier run used (see
`workbench.fleet.tenants`), so each starts from cold caches without restarting the replicas.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pandas as pd

from workbench.fleet.compare import FailureRun, PolicyRun, run_policy, run_with_failure
from workbench.fleet.launcher import Fleet
from workbench.fleet.processes import still_running
from workbench.fleet.replica import COUNTERS, ReplicaOptions
from workbench.fleet.router import COMPARED, router_version
from workbench.fleet.tenants import tenant_workload
from workbench.lab.kit.notebook import REAL_MODEL_LABEL
from workbench.lab.kit.progress import ProgressFn, no_progress
from workbench.monitoring.scrape import MetricsScraper

REPLICAS = 2
OPTIONS = ReplicaOptions(num_blocks=64, max_num_seqs=4)
TENANTS, USERS, CONCURRENCY, MAX_TOKENS = 6, 4, 4, 4
SWEEP_TENANTS = (2, 6, 10)
SWEEP_POLICIES = ("round_robin", "cache_aware")

_runs = itertools.count(1)


def next_run() -> int:
    """A new run number: the prompts of the next measurement share nothing with any earlier one's."""
    return next(_runs)


def start_fleet(replicas: int = REPLICAS, *, policy: str = "cache_aware",
                options: ReplicaOptions = OPTIONS) -> Fleet:
    """The chapter's fleet, started and warmed up (stop it with ``fleet.close()``; it also stops at exit)."""
    fleet = Fleet(replicas, policy=policy, options=options).start()
    try:
        warm_up(fleet)
    except BaseException:
        fleet.close()
        raise
    return fleet


def warm_up(fleet: Fleet) -> None:
    """Two short requests straight to each replica, so that no measured run pays a process's first forward
    passes (allocations, lazy initialisation); their prompts share nothing with the chapter's workload."""
    for replica in fleet.replicas:
        for i in range(2):
            body = {"model": fleet.options.model, "max_tokens": 2,
                    "messages": [{"role": "user", "content": f"Warm-up {i} of replica {replica.index}."}]}
            httpx.post(f"{replica.url}/v1/chat/completions", json=body, timeout=120.0).raise_for_status()


def fleet_label(fleet: Fleet) -> str:
    """'measured on …': the subtitle of every figure of the chapter."""
    threads = {len(set(r.cpus)) for r in fleet.replicas}
    o = fleet.options
    return (f"measured on {fleet.size} replicas x {'/'.join(map(str, sorted(threads)))} CPU thread(s) · {o.dtype} · "
            f"{REAL_MODEL_LABEL} · {o.num_blocks} KV blocks of {o.block_size} each · vllm-router {router_version()}")


def pool_tenants(fleet: Fleet, prompt_tokens: float) -> float:
    """How many tenants' prompts of ``prompt_tokens`` one replica's KV pool holds (before any running request)."""
    o = fleet.options
    return o.num_blocks * o.block_size / prompt_tokens if o.num_blocks else math.inf


# ---- the policies side by side -------------------------------------------------------------------------------
def compare_policies(fleet: Fleet, policies: tuple[str, ...] = COMPARED, *, tenants: int = TENANTS,
                     users_per_tenant: int = USERS, concurrency: int = CONCURRENCY, max_tokens: int = MAX_TOKENS,
                     progress: ProgressFn = no_progress) -> dict[str, PolicyRun]:
    """The same tenant workload (fresh prompts each) through a new router per policy, in turn."""
    out: dict[str, PolicyRun] = {}
    for i, policy in enumerate(policies):
        progress(i, len(policies), f"{policy}: {tenants * users_per_tenant} requests")
        out[policy] = run_policy(fleet, policy, tenants=tenants, users_per_tenant=users_per_tenant,
                                 concurrency=concurrency, max_tokens=max_tokens, run=next_run())
    progress(len(policies), len(policies), "done")
    return out


def policy_table(runs: dict[str, PolicyRun]) -> pd.DataFrame:
    """One row per policy: n, hit rate, TTFT p50/p90, throughput, the busiest replica's share."""
    return pd.DataFrame([r.row() for r in runs.values()]).set_index("policy")


def replica_table(runs: dict[str, PolicyRun]) -> pd.DataFrame:
    """One row per policy and replica: requests served, prompt tokens, prefix hits, hit rate (its /metrics)."""
    frames = [r.replicas.assign(policy=p) for p, r in runs.items()]
    columns = ["policy", "replica", "requests", "share", "prompt_tokens", "prefix_queries", "prefix_hits",
               "hit_rate"]
    return pd.concat(frames, ignore_index=True)[columns]


def seconds_per_request(runs: dict[str, PolicyRun] | list[PolicyRun]) -> float:
    """Wall seconds per request over earlier runs: the basis of the controls' time estimates."""
    runs = list(runs.values()) if isinstance(runs, dict) else runs
    seconds = sum(r.summary["duration_s"] for r in runs)
    requests = sum(len(r.requests) for r in runs)
    return seconds / requests if requests else 0.25


# ---- tenants against what the caches hold --------------------------------------------------------------------
def tenant_sweep(fleet: Fleet, tenants: tuple[int, ...] = SWEEP_TENANTS, policies: tuple[str, ...] = SWEEP_POLICIES,
                 *, users_per_tenant: int = USERS, concurrency: int = CONCURRENCY,
                 reuse: dict[str, PolicyRun] | None = None, progress: ProgressFn = no_progress) -> pd.DataFrame:
    """Hit rate and TTFT per policy and number of tenants (each tenant sends ``users_per_tenant`` requests).
    Runs in ``reuse`` with the same tenants, users and concurrency are taken as they are, not run again."""
    reuse = reuse or {}
    points = [(t, p) for t in tenants for p in policies]
    rows = []
    for i, (count, policy) in enumerate(points):
        done = reuse.get(policy)
        if done is None or (done.tenants, done.users_per_tenant, done.concurrency) != (count, users_per_tenant,
                                                                                       concurrency):
            progress(i, len(points), f"{policy}, {count} tenants")
            done = run_policy(fleet, policy, tenants=count, users_per_tenant=users_per_tenant,
                              concurrency=concurrency, run=next_run())
        ok = done.requests[done.requests["success"].astype(bool)]
        rows.append({**done.row(), "users_per_tenant": users_per_tenant,
                     "prompt_tokens": float(done.requests["prompt_tokens"].mean()),
                     "misses_per_tenant": float(done.misses_per_tenant().mean()),
                     "ttft_ms_all": (ok["ttft_s"] * 1e3).tolist()})
    progress(len(points), len(points), "done")
    return pd.DataFrame(rows)


def sweep_estimate_s(tenants: tuple[int, ...], policies: tuple[str, ...], users_per_tenant: int,
                     per_request_s: float) -> float:
    """Seconds a sweep should take at ``per_request_s`` (plus a second per router start)."""
    return len(policies) * sum(t * users_per_tenant * per_request_s + 1.0 for t in tenants)


# ---- a replica killed mid-run --------------------------------------------------------------------------------
def failure_run(fleet: Fleet, *, policy: str = "cache_aware", retries: bool = True, kill_at_s: float = 2.0,
                progress: ProgressFn = no_progress) -> FailureRun:
    """18 requests at 4 per second, 16 tokens each; the last replica is killed (SIGKILL) ``kill_at_s`` in."""
    progress(0, 1, "restarting a dead replica first" if not all(r.alive for r in fleet.replicas) else "running")
    result = run_with_failure(fleet, policy=policy, retries=retries, kill_at_s=kill_at_s, run=next_run())
    progress(1, 1, "done")
    return result


def outcome_table(run: FailureRun) -> pd.DataFrame:
    """Requests by when they were sent (before, across or after the kill) and how they ended."""
    table = pd.crosstab(run.requests["when"], run.requests["outcome"])
    order = [w for w in ("done before the kill", "under way at the kill", "sent after the kill") if w in table.index]
    return table.loc[order]


# ---- the scrapes ---------------------------------------------------------------------------------------------
def scrape_replicas(fleet: Fleet) -> pd.DataFrame:
    """One Prometheus-style scrape of every live replica (`workbench.monitoring.MetricsScraper`, as chapter 8
    scrapes one server): lifetime requests and prefix-cache hit rate per replica."""
    rows = []
    for replica in fleet.replicas:
        if not replica.alive:
            continue
        totals = _scrape_totals(replica.url)
        values = {key: float(totals.get(name, 0.0)) for key, name in COUNTERS.items()}
        rows.append({"target": replica.url, "replica": replica.index, **values})
    out = pd.DataFrame(rows)
    out["hit_rate"] = out["prefix_hits"] / out["prefix_queries"].where(out["prefix_queries"] > 0)
    return out


def _scrape_totals(url: str) -> pd.Series:
    """One scrape of ``url``/metrics: each sample name's value, summed over its labels."""
    scraper = MetricsScraper(url)
    try:
        scraper.scrape_once()
    finally:
        scraper.close()
    return scraper.frame().groupby("name")["value"].sum()


def router_metrics_source(fleet: Fleet, scrapes: int = 4) -> list[int | None]:
    """Which replica answered each of ``scrapes`` reads of the *router's* ``/metrics``: it forwards the request to
    one worker, so a Prometheus target on the router sees one replica at a time, never the fleet."""
    replicas = scrape_replicas(fleet).set_index("replica")
    sources: list[int | None] = []
    for _ in range(scrapes):
        totals = _scrape_totals(fleet.url)
        seen = float(totals.get(COUNTERS["prefix_queries"], math.nan))
        match = [int(i) for i, row in replicas.iterrows() if row["prefix_queries"] == seen]
        sources.append(match[0] if len(match) == 1 else None)
    return sources


def router_workers(fleet: Fleet) -> pd.DataFrame:
    """The router's own view of its workers (``GET /workers``): health and in-flight load as it counts them."""
    workers = httpx.get(f"{fleet.url}/workers", timeout=5.0).json()["workers"]
    return pd.DataFrame(workers)[["url", "is_healthy", "load"]]


def bench_through_router(fleet: Fleet, *, tenants: int = 3, users_per_tenant: int = 3,
                         concurrency: int = CONCURRENCY) -> tuple[str, str]:
    """``workbench bench`` itself (the command line, in a child process) pointed at the router, on a tenant
    workload written to a JSONL file as any workload file is; returns the command as typed and its report."""
    workload = tenant_workload(tenants, users_per_tenant, max_tokens=MAX_TOKENS, run=next_run())
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tenants.jsonl"
        path.write_text("".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in workload))
        args = ["bench", "--base-url", fleet.url, "--workload", str(path), "--concurrency", str(concurrency),
                "--no-progress"]
        done = subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                              timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"workbench bench failed ({done.returncode}):\n{done.stderr[-2000:]}")
    shown = " ".join(["workbench", *args]).replace(str(path), "tenants.jsonl")
    return shown, done.stdout


def leftover_processes(fleet: Fleet) -> list[int]:
    """Processes the fleet started (router, replicas and anything they spawned) that still run: none after
    ``fleet.close()``."""
    return sorted(still_running(fleet.pids()))
