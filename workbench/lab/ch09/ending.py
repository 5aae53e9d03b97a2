"""Chapter 9's 'Try this' exercises and its closing table, computed from the chapter's own results.

The book has no fleet chapter; its claims about routing and multi-GPU caches are in chapter 5 (cache-aware
scheduling, "even across a multi-server deployment"), chapter 2 (the KV cache in multi-GPU deployments) and
chapter 8 (what a falling hit rate means). The router's own claims (retries, circuit breaker) are from
vllm-router's options.
"""

from __future__ import annotations

import math

import pandas as pd

from workbench.fleet.compare import FailureRun, PolicyRun
from workbench.lab.kit.closing import ClosingTable, Takeaway, Verdict
from workbench.lab.kit.evidence import Evidence
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


def ttft_evidence(sweep: pd.DataFrame) -> list[Evidence]:
    """Per tenants point: cache_aware's median TTFT over round_robin's, resampled over the point's requests."""
    evidence = []
    for tenants, rows in sweep.groupby("tenants"):
        by = rows.set_index("policy")
        if not {"cache_aware", "round_robin"} <= set(by.index) or "ttft_ms_all" not in by.columns:
            continue
        evidence.append(Evidence.bootstrap(f"TTFT p50 at {tenants} tenants, cache_aware / round_robin",
                                           by.loc["cache_aware", "ttft_ms_all"], by.loc["round_robin", "ttft_ms_all"],
                                           expect="below"))
    return evidence


def gain_reading(sweep: pd.DataFrame, pool_holds: float, replicas: int) -> str:
    """How cache_aware's hit-rate gain over round_robin moves with the tenants, against what the pools hold."""
    by = sweep.set_index(["tenants", "policy"])["hit_rate"]
    points = sorted(sweep["tenants"].unique())
    ratios = {t: by[(t, "cache_aware")] / by[(t, "round_robin")] for t in points}
    peak = max(ratios, key=ratios.get)
    fleet = pool_holds * replicas
    where = ("between what one replica's pool holds and what the fleet's pools hold: below one pool a cache-blind "
             "router also keeps every prompt somewhere, past the fleet's both policies evict"
             if pool_holds <= peak <= fleet else "outside the span between one pool and the fleet's pools")
    return ("cache_aware's hit rate over round_robin's: " + ", ".join(f"{ratios[t]:.2f}x at {t}" for t in points)
            + f" tenants; the gain is largest at {peak} tenants, {where} ({pool_holds:.1f} and {fleet:.1f} tenants' "
              "prompts while idle)")


def _ttft_text(by_point: pd.DataFrame, tenants: list[int]) -> str:
    def one(t: int) -> str:
        ca, rr = by_point.loc[(t, "cache_aware")], by_point.loc[(t, "round_robin")]
        return (f"{ca['ttft_p50_ms']:.0f} vs {rr['ttft_p50_ms']:.0f} ms at {t} (busiest replica "
                f"{ca['busiest_share']:.0%} of cache_aware's requests)")
    return "TTFT p50 cache_aware against round_robin by tenants: " + "; ".join(one(t) for t in tenants)


def _routing_note(ratio: float) -> str:
    why = ("cache-blind routing pays a cold miss per tenant on every replica and, past one replica's pool, "
           "evictions; how much that costs depends on the replicas, the tenants per replica and how many requests "
           "each tenant sends")
    return f"higher, not far above ({ratio:.1f}x): {why}" if ratio < 1.5 else why


def closing_table(policies: dict[str, PolicyRun], sweep: pd.DataFrame, failure: FailureRun,
                  router_sources: list[int | None], pool_holds: float, replicas: int) -> ClosingTable:
    """The book's claims about routing and caches across servers, against this chapter's measurements."""
    ca, rr = policies["cache_aware"], policies["round_robin"]
    blind = {p: r for p, r in policies.items() if p != "cache_aware"}
    best_blind = max(r.hit_rate for r in blind.values())
    ratio = ca.hit_rate / max(best_blind, 1e-9)
    misses = {p: float(r.misses_per_tenant().mean()) for p, r in policies.items()}
    n = ca.users_per_tenant
    bound = (n - 1) / max(n - replicas, 1)
    rates = ", ".join(f"{p} {r.hit_rate:.0%}" for p, r in policies.items())
    after = failure.after_kill()
    after_ok = int((after["outcome"] == "completed").sum())
    under_way = failure.requests[failure.requests["when"] == "under way at the kill"]
    in_flight = {o: int((under_way["outcome"] == o).sum()) for o in under_way["outcome"].unique()}
    one_replica = bool(router_sources) and all(s is not None for s in router_sources)
    by_point = sweep.set_index(["tenants", "policy"])
    ttfts = ttft_evidence(sweep)
    return ClosingTable([
        Takeaway.judged(
            "Routing requests to the server whose cache is warm for their prefix gives hit rates far above what "
            "random routing gives, even across a multi-server deployment (chapter 5).",
            f"{ca.tenants} tenants x {n} users on {replicas} replicas, fleet hit rate (tokens, from each replica's "
            f"/metrics): {rates}, so cache_aware {ratio:.1f}x the best cache-blind policy (random routing itself is "
            "not run: the cache-blind policies here are round_robin and power_of_two; of the system prompts' "
            f"tokens round-robin reads (N-R)/N when it splits each tenant evenly and evicts nothing, cache_aware "
            f"(N-1)/N, {bound:.2f}x apart with N = {n} requests per tenant and R = {replicas} replicas; a random "
            "router can land above or below that); each tenant's prompt was computed "
            f"{misses['cache_aware']:.1f} times with cache_aware, {misses['round_robin']:.1f} with round_robin",
            Evidence.exact("hit rate, cache_aware minus the best cache-blind policy", ca.hit_rate - best_blind, 0.0,
                           n=ca.n, n_label=f"{ca.n} requests (token counters)", unit="pts"),
            caveat=ratio < 1.5, caveat_note=_routing_note(ratio),
            wrong_note=f"not higher in this run ({ratio:.2f}x): the per-replica table shows where the tenants went"),
        Takeaway.judged(
            "Prefix caching cuts the prefill cost of requests that share a static prompt (chapter 2), so better "
            "routing means faster first tokens.",
            _ttft_text(by_point, sorted(sweep["tenants"].unique())),
            ttfts or [Evidence.absent("TTFT per request at each tenants point")],
            wrong_note="at some point of the sweep cache_aware was slower beyond the noise: with a handful of "
                       "requests in flight the router's balance threshold (64 requests) never triggers, so it pins "
                       "tenants to replicas unevenly, and the busier replica's queue costs more than the hits save",
            unmeasurable_note="one run per point, and the points disagree: most differences are within their "
                              "requests' spread, and where one is outside it (the evidence names it) a single run "
                              "cannot tell a routing effect from a queue; the hit rate (row 1) is what routing "
                              "measurably changed here"),
        Takeaway(
            "In multi-GPU deployments the total KV cache memory is the same however it is distributed (chapter 2).",
            f"not measured for one model split across GPUs (tensor or pipeline parallel: chapter 2 computes it); "
            f"for {replicas} replicas the pools add up (each holds about {pool_holds:.1f} tenants' prompts while "
            f"idle, fewer while running requests hold blocks), but at {int(sweep['tenants'].max())} tenants "
            f"round_robin held {by_point.loc[(int(sweep['tenants'].max()), 'round_robin'), 'hit_rate']:.0%} and "
            f"cache_aware {by_point.loc[(int(sweep['tenants'].max()), 'cache_aware'), 'hit_rate']:.0%}",
            Verdict.NOT_MEASURABLE,
            note="the claim is about one model split across GPUs, which this fleet of replicas does not run; for "
                 "replicas the memory adds up but the prompts it holds do not: round-robin caches every tenant in "
                 "every replica, and only cache-aware routing partitions the tenants and uses the sum",
            evidence=(Evidence.absent("a model split across GPUs"),)),
        Takeaway.judged(
            "A prefix-cache hit rate that falls below its baseline points at a prompt change, a deployment issue or "
            "a routing change (chapter 8).",
            f"same replicas, same workload, only the router's policy changed: {ca.hit_rate:.0%} with cache_aware, "
            f"{rr.hit_rate:.0%} with round_robin; the router's own /metrics answered with one replica's numbers in "
            f"{sum(s is not None for s in router_sources)} of {len(router_sources)} scrapes",
            Evidence.exact("hit rate, cache_aware minus round_robin", ca.hit_rate - rr.hit_rate, 0.1,
                           n=rr.n, n_label=f"{rr.n} requests (token counters)", unit="pts"),
            caveat=one_replica,
            caveat_note="scrape every replica: a scrape of the router's /metrics is forwarded to one worker, so it "
                        "shows one replica's counters, never the fleet's",
            wrong_note="changing the policy moved the hit rate by less than 10 points here"),
        Takeaway.judged(
            "The router hides a failed worker from clients: it retries on another worker and opens a circuit "
            "breaker (vllm-router's options: 5 attempts (4 retries) with backoff by default).",
            f"replica {failure.killed} killed {failure.kill_s:.1f} s in ({failure.policy}, retries "
            f"{'on' if failure.retries_enabled else 'off'}): {after_ok} of {len(after)} requests sent after the "
            f"kill completed; of the {len(under_way)} under way at the kill: "
            + ", ".join(f"{k} {v}" for k, v in in_flight.items())
            + f"; the router counted {failure.router['retries']:.0f} retries (which worker each went to is not "
              f"logged); the longest request took {failure.longest_s:.1f} s and every one ended: "
              f"{failure.all_finished}",
            Evidence.exact("share of the requests sent after the kill that completed", after_ok / max(len(after), 1),
                           1 - 0.5 / max(len(after), 1), n=len(after), n_label=f"{len(after)} requests", unit="%"),
            caveat=len(under_way) > in_flight.get("completed", 0),
            caveat_note="only for requests sent after the kill: of those under way, a stream already forwarded is "
                        "cut mid-answer, one that got an error status back is refused, and one whose connection "
                        "died before its first token fails; their clients must retry themselves",
            wrong_note=(_hidden_failure_note(failure) if failure.retries_enabled else
                        "with retries off, every request the router sends to the dead replica fails (HTTP 500) "
                        "until its circuit breaker opens (after 10 failures by default) or its health check "
                        "(every 60 s) gives up on it")),
    ])


def _hidden_failure_note(failure: FailureRun) -> str:
    """Why requests sent after the kill failed although the router retries, read from their errors and counters."""
    after = failure.after_kill()
    failed = after[after["outcome"] != "completed"]
    dead = failure.failed_on_the_dead_replica()
    last = float(failed["start_s"].max() - failure.kill_s)
    text = (f"{len(failed)} of {len(after)} requests sent after the kill failed, the last sent {last:.1f} s after "
            "it")
    if len(dead) == len(failed):
        text += (f"; each got the router's HTTP 500 naming the killed replica once its retries were exhausted (the "
                 f"router counted {failure.router['retries_exhausted']:.0f} exhausted): the retries went back to "
                 "the dead worker, which the policy still chose for that prefix, because its circuit breaker "
                 "opens only after 10 failures; every request sent later completed on the live replica")
    else:
        text += "; the router did not hide the dead worker from them"
    return text
