"""The fleet launcher: every process it starts is gone after it stops (checked with psutil, grandchildren
included), after a failed start and after an interrupted one; clear errors for a missing router and a taken port.

The tests that need running replicas share one small fleet (two replicas of the real model, one core each) and
are in tests/fleet/test_fleet_routing.py; the ones here start no model, except the first, which starts the fleet once
end to end.
"""

from __future__ import annotations

import socket

import httpx
import psutil
import pytest

from workbench.fleet import launcher, processes, router
from workbench.fleet.launcher import Fleet
from workbench.fleet.processes import ChildProcess, PortTakenError, cpu_shares, still_running
from workbench.fleet.replica import ReplicaOptions
from workbench.fleet.router import RouterNotFoundError
from workbench.fleet.tenants import TENANTS, tenant_prompt, tenant_workload

SMALL = ReplicaOptions(num_blocks=32, max_num_seqs=2)


def process_tree(pids: list[int]) -> set[int]:
    """The pids and all their descendants that exist now."""
    found = set()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            found |= {pid} | {child.pid for child in proc.children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    return found





@pytest.mark.external  # vllm-router
def test_a_fleet_routes_a_request_and_leaves_no_process_behind():
    with Fleet(2, policy="round_robin", options=SMALL) as fleet:
        tree = process_tree(fleet.pids())
        assert len(fleet.pids()) == 3 and still_running(tree) == tree
        ports = {int(url.rsplit(":", 1)[1]) for url in fleet.replica_urls}
        assert len(ports) == 2
        reply = httpx.post(f"{fleet.url}/v1/chat/completions", timeout=60, json={
            "model": "smollm2-135m", "max_tokens": 3, "messages": [{"role": "user", "content": "Say hi."}]})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 3
        shares = [set(psutil.Process(r.child.pid).cpu_affinity()) for r in fleet.replicas]
        assert shares == [set(s) for s in cpu_shares(2)]
        router_pid = fleet.router.child.pid
        fleet.set_policy("cache_aware")  # a new router; the old one is gone
        assert not still_running({router_pid})
        tree |= process_tree(fleet.pids())
    assert not still_running(tree), f"left running: {still_running(tree)}"
    assert not fleet.started


def test_a_router_that_fails_to_start_takes_the_replicas_down(monkeypatch):
    monkeypatch.setattr(launcher.Replica, "wait_ready", lambda self, deadline: None)  # no need to load the model
    fleet = Fleet(2, options=SMALL, router_args=("--no-such-option",))
    with pytest.raises(RuntimeError, match="router .* exited"):
        fleet.start()
    tree = {r.child.pid for r in fleet.replicas} | {fleet.router.child.pid}
    assert len(tree) == 3 and not still_running(tree)


def test_an_interrupted_start_stops_what_had_started(monkeypatch):
    def interrupted(self, deadline):
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher.Replica, "wait_ready", interrupted)
    fleet = Fleet(2, options=SMALL)
    with pytest.raises(KeyboardInterrupt):
        fleet.start()
    pids = {r.child.pid for r in fleet.replicas}
    assert len(pids) == 2 and not still_running(pids)
    assert fleet.router is None


def test_a_taken_port_is_named_before_anything_starts():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortTakenError, match=f"port {port} on 127.0.0.1 is taken"):
            Fleet(2, router_port=port).start()
        fleet = Fleet(2, replica_ports=[processes.free_port(), port])
        with pytest.raises(PortTakenError, match="a replica cannot listen there"):
            fleet.start()
        assert fleet.replicas == []


def test_a_missing_router_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(router.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RouterNotFoundError, match=r"pip install vllm-router==0\.1\.17"):
        Fleet(2)


def test_options_and_policies_are_checked():
    with pytest.raises(ValueError, match="unknown routing policy 'kv_aware'"):
        Fleet(2, policy="kv_aware")
    with pytest.raises(ValueError, match="replicas must be an integer"):
        Fleet(0)
    with pytest.raises(ValueError, match="one port per replica"):
        Fleet(2, replica_ports=[1234])
    with pytest.raises(ValueError, match="num_blocks"):
        ReplicaOptions(num_blocks=2)


def test_cores_are_split_into_disjoint_shares(monkeypatch):
    monkeypatch.setattr(processes.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert cpu_shares(2) == [[0, 1, 2], [3, 4]]
    assert cpu_shares(5) == [[0], [1], [2], [3], [4]]
    assert cpu_shares(7)[5:] == [[0], [1]]  # more replicas than cores: shares repeat cores


def test_a_child_process_is_stopped_with_its_group():
    child = ChildProcess("sleeper", ["/bin/sh", "-c", "sleep 60 & sleep 60"]).start()
    try:
        import time

        deadline = time.monotonic() + 10
        while not psutil.Process(child.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = process_tree([child.pid])
        assert len(tree) >= 2
    finally:
        child.close()
    # SIGKILL is delivered asynchronously: the group's last member may take a moment to die after close().
    assert not still_running_after(tree, 5.0)


def still_running_after(pids: set[int], timeout_s: float) -> set[int]:
    """The pids still running (not zombies) once ``timeout_s`` has passed, or none earlier."""
    import time

    deadline = time.monotonic() + timeout_s
    while (alive := still_running(pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def test_tenants_share_nothing_but_the_template_and_users_share_their_tenant():
    first, second = tenant_prompt(0), tenant_prompt(1)
    assert first.split()[0] != second.split()[0]
    assert tenant_prompt(0, run=1) != first  # a new run shares no prefix with an old one
    workload = tenant_workload(3, 4, max_tokens=5)
    assert len(workload) == 12 and all(r.max_tokens == 5 and r.ignore_eos for r in workload)
    by_tenant: dict[str, set[str]] = {}
    for request in workload:
        by_tenant.setdefault(request.tags["tenant"], set()).add(request.system)
    assert sorted(by_tenant) == sorted(name for name, _ in TENANTS[:3])
    assert all(len(systems) == 1 for systems in by_tenant.values())
    assert [r.tags["tenant"] for r in workload] != [r.tags["tenant"] for r in sorted(workload, key=lambda r:
                                                                                  r.tags["tenant"])]
    with pytest.raises(ValueError, match="tenants must be"):
        tenant_workload(len(TENANTS) + 1, 2)
