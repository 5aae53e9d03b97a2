"""Chapter 8, monitoring: a live dashboard over a server's /metrics with a change alert, TPOT against ITL, the
engine's step profiled, capacity planned from measured step costs, and the book's planning arithmetic.

    server.py           the background server on a 2-layer SmolLM2-shaped model (serve), the Grafana check
    runs.py             result objects: DashboardRun (load + scrapes + alert), CapacityFit; the book's arithmetic
    latency.py          TokenLatency (TPOT and ITL from one run), PrefillCost (with the chapter's Baseline)
    panels.py           DashboardLab, the TPOT/ITL figure
    panels_capacity.py  ProfileLab, CapacityPlanLab
    ending.py           the exercises and the closing table
"""

from workbench.lab.kit.lazy import NOTEBOOK_NAMES, lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **NOTEBOOK_NAMES,
    "serve": "server", "serving_model": "server", "grafana_check": "server", "BackgroundServer": "server",
    "RULE": "runs", "FAULTS": "runs", "dashboard_load": "runs", "DashboardRun": "runs", "run_dashboard": "runs",
    "CapacityFit": "runs", "capacity_fit": "runs", "seed_planning": "runs", "prefill_check": "runs",
    "TokenLatency": "latency", "token_latency": "latency", "PrefillCost": "latency", "prefill_cost": "latency",
    "batch_check": "latency", "tail_plan": "ending", "seed_claims": "seed",
    "DashboardLab": "panels", "latency_figure": "panels", "show_latency": "panels",
    "ProfileLab": "panels_capacity", "CapacityPlanLab": "panels_capacity",
    "model_label": "workbench.lab.kit.notebook",
    "exercises": "ending", "closing_table": "ending",
})
