"""Routing through a real fleet (two replicas of the real model behind vllm-router): on chapter 9's workload the
cache-aware policy's prefix-cache hit rate beats round-robin's, each replica's counters add up to what the
clients sent, and ``workbench bench`` works against the router as against one server."""

from __future__ import annotations

import json

import pytest

from workbench.fleet.compare import run_policy
from workbench.fleet.launcher import Fleet
from workbench.lab.ch09 import runs as chapter

pytestmark = pytest.mark.external  # vllm-router in front of two replicas of the real model

@pytest.fixture(scope="module")
def fleet():
    with Fleet(chapter.REPLICAS, options=chapter.OPTIONS) as fleet:
        chapter.warm_up(fleet)
        yield fleet


def test_cache_aware_beats_round_robin_on_the_chapters_workload(fleet):
    workload = {"tenants": chapter.TENANTS, "users_per_tenant": chapter.USERS, "concurrency": chapter.CONCURRENCY,
                "max_tokens": chapter.MAX_TOKENS}
    rr = run_policy(fleet, "round_robin", run=chapter.next_run(), **workload)
    ca = run_policy(fleet, "cache_aware", run=chapter.next_run(), **workload)
    requests = chapter.TENANTS * chapter.USERS
    for run in (rr, ca):
        assert run.n == requests and run.failed == 0
        # every request is counted by exactly one replica, and its prompt tokens by that replica's cache lookups
        assert run.replicas["requests"].sum() == requests
        assert run.replicas["prefix_queries"].sum() == run.requests["prompt_tokens"].sum()
        assert run.replicas["prefix_hits"].sum() == run.requests["cached_tokens"].sum()
    assert (rr.replicas["requests"] == requests / chapter.REPLICAS).all()  # round-robin: an even split
    assert ca.hit_rate > rr.hit_rate + 0.05, (ca.row(), rr.row())
    assert ca.misses_per_tenant().mean() < rr.misses_per_tenant().mean()


def test_workbench_bench_runs_against_the_router(fleet):
    command, report = chapter.bench_through_router(fleet, tenants=2, users_per_tenant=2)
    assert command.startswith(f"workbench bench --base-url {fleet.url}")
    summary = json.loads(report.strip().splitlines()[-1])["summary"]
    assert summary["completed"] == 4 and summary["failed"] == 0
