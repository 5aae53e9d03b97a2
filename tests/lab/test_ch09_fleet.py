"""Chapter 9's lab on a running fleet (two replicas of the real model, shrunk workloads): the panels' results,
named traces, the scrapes, a replica killed mid-run, the exercises and the computed closing table."""

from __future__ import annotations

import pytest

from workbench.fleet.compare import OUTCOMES
from workbench.lab import ch09
from workbench.lab.kit.closing import Verdict
from workbench.lab.kit.figures import trace, trace_names

pytestmark = pytest.mark.external  # vllm-router in front of real replicas

@pytest.fixture(scope="module")
def fleet():
    fleet = ch09.start_fleet()
    yield fleet
    fleet.close()
    assert ch09.leftover_processes(fleet) == []


@pytest.fixture(scope="module")
def panels(fleet):
    policies = ch09.PolicyLab(fleet)
    with policies.changes():
        policies.tenants.value, policies.users.value = 2, 3
    tenants = ch09.TenantsLab(fleet, reuse=policies.result, users=3)
    with tenants.changes():
        tenants.tenants.value = (1, 2)
    sources = ch09.router_metrics_source(fleet, scrapes=2)
    scrape = ch09.scrape_replicas(fleet)
    failure = ch09.FailureLab(fleet).run()
    return policies, tenants, failure, sources, scrape


def test_the_policy_panel_reads_every_replica(panels, fleet):
    policies = panels[0]
    assert list(policies.result) == ["round_robin", "cache_aware", "power_of_two"]
    for run in policies.result.values():
        assert run.n == 6 and run.replicas["requests"].sum() == 6
        assert 0 <= run.hit_rate <= 1
    hits = policies.figures[0]
    assert trace_names(hits) == [f"replica {i}" for i in range(fleet.size)] + ["fleet"]
    assert list(trace(hits, "fleet").y) == [run.hit_rate for run in policies.result.values()]
    assert trace(policies.figures[1], "TTFT p50").y[1] == policies.result["cache_aware"].ttft_p50_ms
    assert len(ch09.replica_table(policies.result)) == 3 * fleet.size


def test_the_sweep_reuses_the_policy_runs_and_marks_the_pools(panels, fleet):
    policies, tenants = panels[0], panels[1]
    sweep = tenants.result
    assert sorted(set(sweep["tenants"])) == [1, 2] and set(sweep["policy"]) == {"round_robin", "cache_aware"}
    reused = sweep[(sweep["tenants"] == 2) & (sweep["policy"] == "cache_aware")].iloc[0]
    assert reused["hit_rate"] == policies.result["cache_aware"].hit_rate
    expected = fleet.options.num_blocks * fleet.options.block_size / sweep["prompt_tokens"].mean()
    assert tenants.pool_holds == pytest.approx(expected)
    assert list(trace(tenants.figures[0], "the fleet's pools hold").x) == [expected * fleet.size] * 2
    assert "cache_aware ttft_p50_ms" in trace_names(tenants.figures[1])


def test_scrapes_see_each_replica_and_the_router_forwards_its_own(panels, fleet):
    sources, scrape = panels[3], panels[4]
    assert list(scrape["replica"]) == list(range(fleet.size))
    assert (scrape["requests"] > 0).all() and scrape["hit_rate"].between(0, 1).all()
    assert all(s in range(fleet.size) for s in sources)  # each answer is exactly one replica's counters


def test_a_killed_replica_ends_every_request(panels):
    failure = panels[2].result
    assert failure.all_finished and len(failure.requests) == 18
    assert set(failure.requests["outcome"]) <= set(OUTCOMES)
    after = failure.after_kill()
    assert len(after) > 0
    # Retries hide the dead replica once its circuit breaker opens; a request in the first moments after the kill
    # can still exhaust its retries on it (seen: the first one, 0.2 s after the kill). Such a failure must be the
    # router's, naming the killed replica, and every request sent after the last such failure completes.
    failed = after[after["outcome"] != "completed"]
    assert len(failure.failed_on_the_dead_replica()) == len(failed)
    if len(failed):
        later = after[after["start_s"] > failed["start_s"].max()]
        assert len(later) and (later["outcome"] == "completed").all()
        assert failure.router["retries_exhausted"] >= 1
    assert set(trace_names(panels[2].figures[0])) == {*OUTCOMES, "replica killed"}
    assert trace(panels[2].figures[0], "replica killed").x[0] == failure.kill_s


def test_the_closing_table_and_exercises_are_computed(panels, fleet):
    policies, tenants, failure, sources, _ = panels
    table = ch09.closing_table(policies.result, tenants.result, failure.result, sources, tenants.pool_holds,
                               fleet.size)
    assert len(table) == 5 and all(isinstance(v, Verdict) for v in table.verdicts)
    after = failure.result.after_kill()
    if (after["outcome"] == "completed").all():
        assert table.verdicts[4] in (Verdict.HOLDS, Verdict.CAVEAT)
    else:  # a request that exhausted its retries on the dead replica: said so, with the router's numbers
        assert table.verdicts[4] is Verdict.WRONG and "exhausted" in table.rows[4].note
    assert "…" not in repr(table)
    exercises = ch09.exercises(policies.result, fleet.options.num_blocks * fleet.options.block_size, fleet.size)
    assert exercises["cold"].check(fleet.size).correct
    assert exercises["cold"].check(fleet.size + 1).correct is False
    best = max(policies.result, key=lambda p: policies.result[p].hit_rate)
    assert exercises["best"].check(best).correct
