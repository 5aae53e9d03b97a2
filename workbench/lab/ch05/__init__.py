"""Chapter 5, batching: static, dynamic and continuous batching on one engine, the throughput-latency frontier and
its knee, what bounds the batch, and who gets served first.

    runs.py               result objects: ModesRun, ConcurrencySweep (knees, goodput), VarianceEffect,
                          BatchCapacity; padding_waste (the load itself: workbench.bench.synthetic)
    claims.py             the book's loose claims computed: dynamic_wait_effect, block_waste,
                          utilization_split, priority_run (PriorityRun), cache_aware_hit_rates
    panels.py             ModesLab, ConcurrencySweepLab (and the EnginePanel they share)
    panels_scheduling.py  VarianceLab, BatchCapacityLab, PriorityLab
    ending.py             the exercises and the closing table
    on_gpu.py           the stored GPU measurement of this chapter beside this device's (on_gpu)
"""

from workbench.lab.kit.lazy import NOTEBOOK_NAMES, lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **NOTEBOOK_NAMES,
    "batching_engine": "workbench.bench.drive", "drive": "workbench.bench.drive", "MODES": "workbench.bench.drive",
    "random_requests": "workbench.bench.synthetic",
    "ModesRun": "runs", "ConcurrencySweep": "runs", "VarianceEffect": "runs", "BatchCapacity": "runs",
    "modes_run": "runs", "concurrency_sweep": "runs", "variance_effect": "runs", "capacity_run": "runs",
    "padding_waste": "runs",
    "PriorityRun": "claims", "priority_run": "claims", "with_priorities": "claims",
    "dynamic_wait_effect": "claims", "block_waste": "claims", "utilization_split": "claims",
    "alternating_families": "claims", "cache_aware_hit_rates": "claims",
    "ModesLab": "panels", "ConcurrencySweepLab": "panels",
    "VarianceLab": "panels_scheduling", "BatchCapacityLab": "panels_scheduling", "PriorityLab": "panels_scheduling",
    "exercises": "ending", "seed_batch_feasibility": "claims", "wait_reading": "claims",
    "padding_reading": "claims", "seed_claims": "seed", "closing_table": "ending",
    "on_gpu": "on_gpu",
})
