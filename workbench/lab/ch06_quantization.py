"""Chapter 6, quantization and the cache: what a notebook imports (``from workbench.lab import ch06_quantization
as ch06``). The measurements are `workbench.lab.ch06_sweep`; the arithmetic `workbench.lab.ch06_memory`; activation
rounding `workbench.lab.ch06_activations`; the panels `workbench.lab.ch06_panels`; call-outs, exercises and the
closing table `workbench.lab.ch06_summary`. The full sweep is `benchmarks/bench_weight_quant.py`.
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
from workbench.lab.ch06_sweep import SWEEP_COMMAND, SWEEP_PATH, describe_cpu, load_sweep

__all__ = ["A100_TBPS", "EXERCISES", "H100_TBPS", "SWEEP_COMMAND", "SWEEP_PATH", "ActivationLab", "KVFormatLab",
           "SweepLab", "WeightFormatLab", "describe_cpu", "hierarchy_table", "kv_breakdown", "load_sweep",
           "seed_checks", "seed_hierarchy", "takeaways", "weight_formats", "weight_variant"]
