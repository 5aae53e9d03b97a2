"""Chapter 10, determinism: why the same prompt at temperature 0 gets different answers, and the batch-invariant
mode that makes it get one.

    runs.py      measurements without widgets: float32 summation orders, which products round with the batch,
                 attention paths, the divergence experiment (engine-side: workbench.quality.determinism), the
                 cached 200-run result (benchmarks/bench_determinism.py)
    panels.py    ProductsLab, DivergenceLab, ModeCostLab and the cached figure
    ending.py    the exercises and the closing table
    on_gpu.py           the stored GPU measurement of this chapter beside this device's (on_gpu)
"""

from workbench.lab.kit.lazy import NOTEBOOK_NAMES, lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **NOTEBOOK_NAMES,
    "PROMPT": "runs", "chat_prompts": "runs", "summation_orders": "runs", "product_check": "runs",
    "attention_paths": "runs",
    "cached_divergence": "runs", "cached_frame": "runs",
    "ProductsLab": "panels", "DivergenceLab": "panels", "ModeCostLab": "panels",
    "cached_divergence_figure": "panels", "show_figure": "workbench.lab.kit.stored",
    "exercises": "ending", "closing_table": "ending", "control_reading": "ending",
    "on_gpu": "on_gpu",
})
