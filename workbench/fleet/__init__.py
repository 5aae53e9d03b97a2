"""Beyond one machine: replicas of ``workbench serve`` behind a real router (vllm-router), measured.

    processes.py   child processes that cannot outlive the fleet (own session, atexit, parent-death signal);
                   free ports, a clear error for a taken one, the cores split into shares
    replica.py     one replica: ``workbench serve`` on its port, cores and KV pool; its /metrics counters
    router.py      vllm-router: finding the binary (a clear error when it is missing), its policies
    launcher.py    ``Fleet``: N replicas and the router, started together, always stopped together
    tenants.py     the multi-tenant workload (several long system prompts, many users each)
    compare.py     one workload through a policy: per-replica hit rate and load, TTFT, throughput; and a
                   replica stopped mid-run
    __main__.py    ``python -m workbench.fleet``: the policies side by side, a table and a JSON line
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "Fleet": "launcher", "ReplicaOptions": "replica", "Replica": "replica",
    "Router": "router", "RouterNotFoundError": "router", "POLICIES": "router", "COMPARED": "router",
    "router_binary": "router", "router_version": "router",
    "PortTakenError": "processes", "cpu_shares": "processes",
    "tenant_workload": "tenants", "tenant_prompt": "tenants",
    "PolicyRun": "compare", "run_policy": "compare", "FailureRun": "compare", "run_with_failure": "compare",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench.fleet' has no attribute {name!r}")
    return getattr(importlib.import_module(f"workbench.fleet.{module}"), name)


def __dir__() -> list[str]:
    return __all__
