"""Chapter 2, the KV cache: generation with and without it, what share of a GPU it gets, contiguous buffers
against paged blocks, copy-on-write forks for parallel sampling, prefix caching, and eviction under a small
budget (LRU on the engine, LFU beside it in a simulator).

    runs.py              result objects and engine runs: CacheComparison, PagedTrace, PrefixRun
    budget.py            the KV share of a GPU and the sequences it holds, from real configs (KVShare, KVCapacity)
    fork.py              parallel sampling on the paged cache, block tables per step (ForkTrace)
    eviction.py          hit rate against the cache budget (EvictionSweep) and LRU vs LFU (PolicyComparison)
    policy_sim.py        the block-level LRU/LFU simulator of the engine's prefix cache
    parallel.py          the KV cache across GPUs: per-GPU bytes against the TP degree, the book's claims (TPSweep)
    block_view.py        the block pool replayed step by step (BlockView)
    panels.py            CacheVsNoCacheLab, PagedMemoryLab, PrefixCacheLab
    panels_capacity.py   KVShareLab, KVCapacityLab
    panels_fork.py       ParallelSamplingLab
    panels_eviction.py   EvictionLab, PolicyLab
    panels_parallel.py   tp_figure (computed, no controls)
    architectures.py     the KV cache of 2025-26 architectures by layer group (ArchitectureSizes), the engine's
                         KV-group allocator live (SlidingRun), the window what-if (WhatIf: stored and live)
    panels_architectures.py  ArchitectureLab, architecture_reading (its status), WindowWhatIfLab, sliding_figure,
                             whatif_figure
    ending.py            the exercises and the closing table
    on_gpu.py           the stored GPU measurement of this chapter beside this device's (on_gpu)
"""

from workbench.lab.kit.lazy import NOTEBOOK_NAMES, lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **NOTEBOOK_NAMES,
    "CacheComparison": "runs", "PagedTrace": "runs", "PrefixRun": "runs", "cache_vs_no_cache": "runs",
    "trace_paged_run": "runs", "prefix_cache_run": "runs", "prefix_prompts": "runs", "LAYOUTS": "runs",
    "KVShare": "budget", "KVCapacity": "budget", "kv_share": "budget", "kv_capacity": "budget",
    "kv_share_table": "budget", "share_verdict": "budget", "deployment_budget": "budget",
    "ForkTrace": "fork", "parallel_sampling_trace": "fork",
    "EvictionSweep": "eviction", "PolicyComparison": "eviction", "eviction_run": "eviction",
    "policy_comparison": "eviction", "eviction_prompts": "eviction", "access_order": "eviction",
    "simulate": "policy_sim", "policy_sweep": "policy_sim",
    "TPSweep": "parallel", "tp_sweep": "parallel", "parallel_seed_checks": "parallel",
    "tp_figure": "panels_parallel", "show_figure": "workbench.lab.kit.stored",
    "CacheVsNoCacheLab": "panels", "PagedMemoryLab": "panels", "PrefixCacheLab": "panels",
    "KVShareLab": "panels_capacity", "KVCapacityLab": "panels_capacity",
    "ParallelSamplingLab": "panels_fork",
    "EvictionLab": "panels_eviction", "PolicyLab": "panels_eviction",
    "exercises": "ending", "closing_table": "ending", "share_reading": "budget", "chapter_baseline": "runs",
    "seed_claims": "seed",
    "on_gpu": "on_gpu",
    "ARCHITECTURES": "architectures", "ArchitectureSizes": "architectures", "architecture_sizes": "architectures",
    "SlidingRun": "architectures", "sliding_run": "architectures", "WhatIf": "architectures",
    "whatif_quality": "architectures", "cached_whatif": "architectures", "live_whatif": "architectures",
    "whatif_reading": "architectures",
    "ArchitectureLab": "panels_architectures", "WindowWhatIfLab": "panels_architectures",
    "sliding_figure": "panels_architectures", "whatif_figure": "panels_architectures",
    "architecture_reading": "panels_architectures",
})
