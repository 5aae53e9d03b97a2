"""Chapter 1, how attention works and why it costs: N² attention against the linear parts of a layer, time to
first token against prompt length, the N² memory of materialised scores, and the KV memory of MHA/GQA/MQA/SWA
read from real configs.

    workbench.roofline.layer_cost   FLOPs per layer part and the crossover length from a config; one layer's
                        parts timed (outside the lab: the GPU session's benchmarks time it too)
    runs.py             result objects: LayerTiming, ContextTTFT (with the chapter's Baseline), KVMemory
    memory.py           one layer's activation peak, materialised vs fused (AttentionMemory, TensorPeak)
    panels.py           LayerScalingLab, KVMemoryLab
    panels_prefill.py   ContextTTFTLab, AttentionMemoryLab
    crossover_128k.py   the crossover verdict redone at each config's own context, 128K configs and hybrids included
    ending.py           the exercises and the closing table
    on_gpu.py           the stored GPU measurement of this chapter beside this device's (on_gpu)
"""

from workbench.lab.kit.lazy import NOTEBOOK_NAMES, lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **NOTEBOOK_NAMES,
    **dict.fromkeys(("PARTS", "layer_flops", "crossover_length", "flop_table", "flop_table_text",
                     "linear_params_per_layer", "time_layer_parts"), "workbench.roofline.layer_cost"),
    "LayerTiming": "runs", "ContextTTFT": "runs", "KVMemory": "runs", "layer_timing": "runs", "context_ttft": "runs",
    "kv_memory": "runs",
    "AttentionMemory": "memory", "TensorPeak": "memory", "attention_memory": "memory",
    "LayerScalingLab": "panels", "KVMemoryLab": "panels",
    "ContextTTFTLab": "panels_prefill", "AttentionMemoryLab": "panels_prefill",
    "exercises": "ending", "closing_table": "ending", "configs_past_crossover": "ending",
    "crossover_summary": "ending", "read_config": "ending", "seed_claims": "seed",
    "attention_variants": "workbench.cache.sizing", "sizing_table": "workbench.cache.sizing",
    "weight_bytes": "workbench.cache.sizing",
    "on_gpu": "on_gpu",
    "crossover_table": "crossover_128k", "crossover_verdict": "crossover_128k", "model_crossover": "crossover_128k",
    "hybrid_shapes": "crossover_128k",
})
