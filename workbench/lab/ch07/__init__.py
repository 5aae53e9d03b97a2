"""Chapter 7, speculative decoding on the real engine, with the theory drawn beside every measurement.

    runs.py           measurements without widgets: the book's arithmetic redone, today's vLLM names and counters,
                      AcceptanceRun (both proposers on a task set beside plain decoding), BatchRun (the same at
                      several batch sizes); the runs themselves are engine-side (workbench.spec_experiments)
    trace.py          one request pass by pass (RequestTrace) and its token-coloured HTML view
    trees.py          chain vs static tree vs dynamic tree at one verification budget (TreeComparison;
                      engine-side: workbench.spec_experiments.tree_compare)
    panels.py         ForwardCostLab, TokenTraceLab, AcceptanceLab
    panels_sweeps.py  KSweepLab, BatchLab, SamplingLab
    panels_trees.py   TreeLab
    ending.py         the exercises (and one from a measured run) and the closing table
    on_gpu.py           the stored GPU measurement of this chapter beside this device's (on_gpu)
"""

from workbench.lab.kit.lazy import NOTEBOOK_NAMES, lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **NOTEBOOK_NAMES,
    "PLAIN": "runs", "PROPOSERS": "runs", "TASKS": "runs", "task_prompts": "runs", "load_draft": "runs",
    "seed_arithmetic": "runs", "VLLM_NAMES": "runs", "vllm_counters": "runs", "AcceptanceRun": "runs",
    "BatchRun": "runs", "acceptance_run": "runs", "batch_run": "runs", "same_draft_two_runs": "runs",
    "RequestTrace": "trace", "trace_request": "trace", "trace_html": "trace",
    "TreeComparison": "trees", "compare_trees": "trees",
    "ForwardCostLab": "panels", "TokenTraceLab": "panels", "AcceptanceLab": "panels",
    "KSweepLab": "panels_sweeps", "BatchLab": "panels_sweeps", "SamplingLab": "panels_sweeps",
    "TreeLab": "panels_trees",
    "exercises": "ending", "measured_alpha_exercise": "ending", "closing_table": "ending",
    "physical_r": "runs", "seed_timeline_check": "runs", "gpu_batch_reading": "runs", "seed_claims": "seed",
    "expected_tokens_per_pass": "workbench.spec.stats",
    "on_gpu": "on_gpu",
})
