"""Chapter 6, quantization and the cache: what a notebook imports. The measurements are
`workbench.quality.format_sweep`; the rest lives in the ch06_* modules beside this one.
"""

from workbench.lab.ch06_memory import hierarchy_table, weight_formats
from workbench.lab.ch06_panels import (
                                       ActivationLab,
                                       KVFormatLab,
                                       SweepLab,
                                       WeightFormatLab,
                                       kv_breakdown,
                                       weight_variant,
)
from workbench.lab.ch06_summary import A100_TBPS, EXERCISES, H100_TBPS, seed_checks, seed_hierarchy, takeaways
from workbench.quality.format_sweep import SWEEP_COMMAND, SWEEP_PATH, describe_cpu, load_sweep

__all__ = ["A100_TBPS", "EXERCISES", "H100_TBPS", "SWEEP_COMMAND", "SWEEP_PATH", "ActivationLab", "KVFormatLab",
           "SweepLab", "WeightFormatLab", "describe_cpu", "hierarchy_table", "kv_breakdown", "load_sweep",
           "seed_checks", "seed_hierarchy", "takeaways", "weight_formats", "weight_variant"]
