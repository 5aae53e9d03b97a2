"""Chapter 9's 'Try this' exercises and its closing table, computed from the chapter's own results.

The seed has no fleet chapter; its claims about routing and multi-GPU caches are in chapter 5 (cache-aware
scheduling, "even across a multi-server deployment"), chapter 2 (the KV cache in multi-GPU deployments) and
chapter 8 (what a falling hit rate means). The router's own claims (retries, circuit breaker) are from
vllm-router's options.
"""

from __future__ import annotations

import math

import pandas as pd

from workbench.fleet.compare import FailureRun, PolicyRun
from workbench.lab.kit.closing import ClosingTable, Takeaway, Verdict
from workbench.lab.kit.exercises import Exercise


def exercises(policies: dict[str, PolicyRun], pool_tokens: int, replicas: int) -> dict[str, Exercise]:
    """``pool_tokens``: one replica's KV pool in tokens (blocks x block size)."""
    best = max(policies, key=lambda p: policies[p].hit_rate)
    prompt = float(pd.concat([r.requests["prompt_tokens"] for r in policies.values()]).mean())
    return {
        "best": Exercise(
            "Which policy gave the fleet the highest prefix-cache hit rate? (its name, e.g. 'round_robin')",
            lambda: best,
            why="read from the policy panel's fleet markers: only one policy sends a tenant's requests back to the "
                "replica that already holds its system prompt",
            hint="the black diamonds of the first figure"),
        "pool": Exercise(
            f"One replica's KV pool holds {pool_tokens:,} tokens; a request's prompt averaged {prompt:.0f} tokens. "
            "How many tenants' prompts does one replica's pool hold at most (a whole number, rounded down)?",
            lambda: math.floor(pool_tokens / prompt),
            why="the pool's token slots over the prompt length; running requests need slots too, so fewer stay "
                "cached while the fleet is busy", rel_tol=0.0),
        "cold": Exercise(
            f"Round-robin over {replicas} replicas, a tenant sending many requests, no eviction: at least how many "
            "times is the tenant's system prompt computed from scratch?",
            lambda: replicas,
            why="every replica sees every tenant and warms its own cache: one cold miss per replica, where "
                "cache-aware routing pays one per tenant", rel_tol=0.0),
    }


def _sweep_gap(sweep: pd.DataFrame, tenants: int) -> float:
    rows = sweep[sweep["tenants"] == tenants].set_index("policy")["hit_rate"]
    return float(rows["cache_aware"] - rows["round_robin"])


def _routing_note(ratio: float) -> str:
    why = ("cache-blind routing pays a cold miss per tenant on every replica and, past one replica's pool, "
           "evictions; how much that costs depends on the replicas, the tenants per replica and how many requests "
           "each tenant sends")
    if ratio <= 1.0:
        return f"not higher in this run ({ratio:.2f}x): the per-replica table shows where the tenants went; {why}"
    return f"higher, not far above ({ratio:.1f}x): {why}" if ratio < 1.5 else why


def closing_table(policies: dict[str, PolicyRun], sweep: pd.DataFrame, failure: FailureRun,
                  router_sources: list[int | None], pool_holds: float, replicas: int) -> ClosingTable:
    """The seed's claims about routing and caches across servers, against this chapter's measurements."""
    ca, rr = policies["cache_aware"], policies["round_robin"]
    blind = {p: r for p, r in policies.items() if p != "cache_aware"}
    ratio = ca.hit_rate / max(max(r.hit_rate for r in blind.values()), 1e-9)
    misses = {p: float(r.misses_per_tenant().mean()) for p, r in policies.items()}
    many = int(sweep["tenants"].max())
    gap_many = _sweep_gap(sweep, many)
    rates = ", ".join(f"{p} {r.hit_rate:.0%}" for p, r in policies.items())
    after = failure.after_kill()
    after_ok = int((after["outcome"] == "completed").sum())
    cut = failure.counts["cut mid-stream"]
    one_replica = bool(router_sources) and all(s is not None for s in router_sources)
    by_point = sweep.set_index(["tenants", "policy"])["hit_rate"]
    return ClosingTable([
        Takeaway(
            "Routing requests to the server whose cache is warm for their prefix gives hit rates far above what "
            "random routing gives, even across a multi-server deployment (chapter 5).",
            f"{ca.tenants} tenants x {ca.users_per_tenant} users on {replicas} replicas, fleet hit rate (tokens, "
            f"from each replica's /metrics): {rates}, so cache_aware {ratio:.1f}x the best cache-blind policy; each "
            f"tenant's prompt was computed {misses['cache_aware']:.1f} times with cache_aware, "
            f"{misses['round_robin']:.1f} with round_robin; cache_aware against round_robin by tenants: "
            + ", ".join(f"{by_point[(t, 'cache_aware')]:.0%} vs {by_point[(t, 'round_robin')]:.0%} at {t}"
                        for t in sorted(sweep["tenants"].unique())),
            Verdict.judge(all(ca.hit_rate > r.hit_rate for r in blind.values()), caveat=ratio < 1.5),
            note=_routing_note(ratio)),
        Takeaway(
            "Prefix caching cuts the prefill cost of requests that share a static prompt (chapter 2), so better "
            "routing means faster first tokens.",
            f"TTFT p50 {ca.ttft_p50_ms:.0f} ms with cache_aware against {rr.ttft_p50_ms:.0f} ms with round_robin "
            f"(p90 {ca.ttft_p90_ms:.0f} vs {rr.ttft_p90_ms:.0f} ms; n = {ca.n} and {rr.n}); the busiest replica "
            f"served {ca.busiest_share:.0%} of cache_aware's requests",
            Verdict.judge(ca.ttft_p50_ms < rr.ttft_p50_ms,
                          caveat=ca.ttft_p90_ms >= rr.ttft_p90_ms or ca.busiest_share > 1 / replicas + 0.1),
            note="the tail is set by cold starts and load: every tenant's first request still misses, and a router "
                 "that pins tenants to replicas balances load only when the imbalance passes its thresholds "
                 "(64 requests by default)"),
        Takeaway(
            "In multi-GPU deployments the total KV cache memory is the same however it is distributed (chapter 2).",
            f"{replicas} replicas have {replicas}x one replica's pool (which holds about {pool_holds:.1f} tenants' "
            f"prompts), but at {many} tenants round_robin held a hit rate of "
            f"{sweep.set_index(['tenants', 'policy']).loc[(many, 'round_robin'), 'hit_rate']:.0%} against "
            f"cache_aware's {sweep.set_index(['tenants', 'policy']).loc[(many, 'cache_aware'), 'hit_rate']:.0%}",
            Verdict.judge(True, caveat=gap_many > 0.1),
            note="for replicas the memory adds up, the prompts it holds do not: round-robin caches every tenant in "
                 "every replica, so the fleet holds what one replica holds; only cache-aware routing partitions "
                 "the tenants and uses the sum"),
        Takeaway(
            "A prefix-cache hit rate that falls below its baseline points at a prompt change, a deployment issue or "
            "a routing change (chapter 8).",
            f"same replicas, same workload, only the router's policy changed: {ca.hit_rate:.0%} with cache_aware, "
            f"{rr.hit_rate:.0%} with round_robin; the router's own /metrics answered with one replica's numbers in "
            f"{sum(s is not None for s in router_sources)} of {len(router_sources)} scrapes",
            Verdict.judge(ca.hit_rate - rr.hit_rate >= 0.1, caveat=one_replica),
            note="scrape every replica: a scrape of the router's /metrics is forwarded to one worker, so it shows "
                 "one replica's counters, never the fleet's"),
        Takeaway(
            "The router hides a failed worker from clients: it retries on another worker and opens a circuit "
            "breaker (vllm-router's options: 5 retries with backoff by default).",
            f"replica {failure.killed} killed {failure.kill_s:.1f} s in ({failure.policy}, retries "
            f"{'on' if failure.retries_enabled else 'off'}): {after_ok} of {len(after)} requests sent after the "
            f"kill completed, {cut} stream(s) under way were cut, the router retried {failure.router['retries']:.0f} "
            f"time(s); the longest request took {failure.longest_s:.1f} s and every one ended: {failure.all_finished}",
            Verdict.judge(after_ok == len(after) and failure.all_finished, caveat=cut > 0),
            note=("a stream the router has started forwarding cannot be retried: its client gets a cut connection "
                  "mid-answer and must retry itself" if failure.retries_enabled else
                  "with retries off, every request the router sends to the dead replica fails (HTTP 500) until "
                  "its circuit breaker opens (after 10 failures by default) or its health check (every 60 s) "
                  "gives up on it")),
    ])
