"""Chapter 9, beyond one machine: replicas of ``workbench serve`` behind a real router (vllm-router), and what
the routing policy does to the prefix-cache hit rate, TTFT and load, and to clients when a replica dies.

The fleet itself (replicas, router, the tenant workload, one run per policy) is engine-side, in
`workbench.fleet`; this package sizes it to the chapter and shows it.

    runs.py      measurements without widgets: the chapter's fleet and workload, the policies side by side, the
                 tenants sweep, a replica killed mid-run, the scrapes of the replicas and the router
    panels.py    PolicyLab, TenantsLab, FailureLab
    ending.py    the exercises and the closing table
"""

from workbench.lab.kit.lazy import NOTEBOOK_NAMES, lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **NOTEBOOK_NAMES,
    "REPLICAS": "runs", "OPTIONS": "runs", "TENANTS": "runs", "USERS": "runs",
    "start_fleet": "runs", "fleet_label": "runs", "pool_tenants": "runs", "compare_policies": "runs",
    "policy_table": "runs", "replica_table": "runs", "tenant_sweep": "runs", "failure_run": "runs",
    "outcome_table": "runs", "scrape_replicas": "runs", "router_metrics_source": "runs", "router_workers": "runs",
    "bench_through_router": "runs", "warm_up": "runs",
    "PolicyLab": "panels", "TenantsLab": "panels", "FailureLab": "panels",
    "exercises": "ending", "closing_table": "ending", "gain_reading": "ending", "ttft_evidence": "ending",
    "Fleet": "workbench.fleet.launcher", "tenant_prompt": "workbench.fleet.tenants",
    "router_version": "workbench.fleet.router", "leftover_processes": "runs",
})
