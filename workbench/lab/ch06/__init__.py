"""Chapter 6, quantization and the cache: weight bytes per format, activations that resist rounding, each KV
format's bytes, capacity and quality, int8 weights' speed, and the benchmark's cached weight × KV sweep (measured
engine-side by `workbench.quality.format_sweep`).

    memory.py         weight bytes per format and the book's layered 70B table, recomputed from configs
    activations.py    one layer's real inputs through int8 weights four ways; how uneven activations are
    runs.py           result objects: KVFormats, WeightFormats, ActivationRounding, FormatSweep (the cached sweep,
                      with what a quantized KV costs in speed on this CPU)
    panels.py         KVFormatLab, WeightFormatLab
    panels_sweep.py   ActivationLab, FormatSweepLab
    ending.py         the book's loose figures (seed_checks, seed_hierarchy), the exercises and the closing table
    on_gpu.py           the stored GPU measurement of this chapter beside this device's (on_gpu)
"""

from workbench.lab.kit.lazy import NOTEBOOK_NAMES, lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **NOTEBOOK_NAMES,
    "weight_formats": "memory", "hierarchy_table": "memory", "int4_weight_bytes": "memory",
    "PROJECTIONS": "activations", "VARIANTS": "activations", "capture_inputs": "activations",
    "rounding_errors": "activations", "spread": "activations",
    "KVFormats": "runs", "WeightFormats": "runs", "ActivationRounding": "runs", "FormatSweep": "runs",
    "kv_formats": "runs", "weight_format_row": "runs", "activation_rounding": "runs", "format_sweep": "runs",
    "kv_breakdown": "runs", "saving": "runs", "weight_variant": "runs", "heldout_slice": "runs",
    "KVFormatLab": "panels", "WeightFormatLab": "panels",
    "ActivationLab": "panels_sweep", "FormatSweepLab": "panels_sweep",
    "H100_TBPS": "ending", "A100_TBPS": "ending", "seed_checks": "ending", "seed_hierarchy": "ending",
    "exercises": "ending", "closing_table": "ending", "fp8_quality_reading": "ending",
    "MemoryLimitedRun": "capacity_run", "memory_limited_run": "capacity_run", "MemoryLimitedLab": "panels_capacity",
    "seed_claims": "seed",
    "SWEEP_COMMAND": "workbench.quality.format_sweep", "SWEEP_PATH": "workbench.quality.format_sweep",
    "describe_cpu": "workbench.quality.format_sweep", "load_sweep": "workbench.quality.format_sweep",
    "on_gpu": "on_gpu",
})
