"""Chapter 11, beyond the device's memory: a second KV tier under the prefix cache (host memory, disk), when
restoring a block beats recomputing it, what a tier does to the hit rate and to returning sessions' TTFT, and a
cache that survives a restart.

    runs.py       each tier's measured transfer costs against the prefill, the crossover by prefix length, and
                  the GPU case from stored files (TierCosts, GpuCase)
    tier_sim.py   chapter 2's LRU simulator with a second tier under it (TwoTierSim)
    sessions.py   multi-turn sessions with and without a tier; one stream through the engine and the simulator
    restart.py    a server on a disk tier, restarted
    panels.py     CrossoverLab, HitRateLab, SessionsLab, RestartLab and the GPU figure
    ending.py     the systems table, the exercises and the closing table
"""

from workbench.lab.kit.lazy import NOTEBOOK_NAMES, lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **NOTEBOOK_NAMES,
    "TierCosts": "runs", "measure_tiers": "runs", "crossover_frame": "runs", "gpu_cases": "runs",
    "PCIE5_X16_BYTES_PER_S": "runs", "TIERS": "runs",
    "TwoTierSim": "tier_sim", "simulate_tiers": "tier_sim", "working_set_sweep": "tier_sim",
    "multi_turn": "sessions", "engine_check": "sessions", "stream": "sessions",
    "restart_run": "restart",
    "CrossoverLab": "panels", "HitRateLab": "panels", "SessionsLab": "panels", "RestartLab": "panels",
    "gpu_figure": "panels", "show_figure": "workbench.lab.kit.stored",
    "systems_table": "ending", "exercises": "ending", "closing_table": "ending", "chapter_baseline": "ending",
})
