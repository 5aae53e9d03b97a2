"""The engine's KV pool, decided once at start-up: storage format, number of blocks, fp8 calibration.

Pool size, in order of precedence: an explicit ``num_blocks``; else a ``memory_budget_bytes`` of KV; else, on a
GPU, the serving-engine rule (device memory x utilization - weights - measured activation peak of the largest
step); on the CPU, where the "device memory" is the machine's RAM shared with everything else, a fixed default
budget (`workbench.config.DEFAULT_CPU_KV_BUDGET_BYTES`). Block bytes come from the storage layout itself
(scales included), so quantized formats get proportionally more blocks from the same budget.
"""

from __future__ import annotations

import torch

from workbench.cache.sizing import block_budget
from workbench.config import DEFAULT_CPU_KV_BUDGET_BYTES, CacheConfig, SchedulerConfig
from workbench.engine.memory_probe import measure_activation_peak
from workbench.models.llama import LlamaModel
from workbench_kernels.kv_quant import QUANTIZED_KV_FORMATS, cache_shapes

_FLOAT_NAMES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def kv_format_for(config: CacheConfig, model_dtype: torch.dtype) -> str:
    """The kernels' format name for a cache config (float names must match the model's dtype)."""
    name = config.kv_cache_dtype
    if name in QUANTIZED_KV_FORMATS or name == "auto":
        return name
    if _FLOAT_NAMES[name] != model_dtype:
        raise ValueError(f"kv_cache_dtype {name!r} differs from the model's dtype {model_dtype}: use 'auto' (the "
                         f"model's dtype) or a quantized format {list(QUANTIZED_KV_FORMATS)}")
    return "auto"


def bytes_per_block(model: LlamaModel, config: CacheConfig) -> int:
    """Bytes one block takes across all layers, K and V, scales included."""
    spec = model.spec
    shapes = cache_shapes(kv_format_for(config, model.dtype), 1, config.block_size, spec.num_kv_heads,
                          spec.head_dim, model.dtype)
    per = torch.empty(0, dtype=shapes["data_dtype"]).element_size() * _numel(shapes["data_shape"])
    if shapes["scale_per_slot"]:
        per += torch.empty(0, dtype=shapes["scale_dtype"]).element_size() * _numel(shapes["scale_shape"])
    return 2 * spec.num_layers * per


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def num_blocks_for(model: LlamaModel, config: CacheConfig, scheduler: SchedulerConfig) -> int:
    if config.num_blocks is not None:
        return config.num_blocks
    per_block = bytes_per_block(model, config)
    if config.memory_budget_bytes is not None or model.device.type != "cuda":
        budget = config.memory_budget_bytes or DEFAULT_CPU_KV_BUDGET_BYTES
        if budget < per_block:
            raise ValueError(f"memory_budget_bytes {budget} is smaller than one block ({per_block} bytes)")
        return budget // per_block
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    activations = measure_activation_peak(model, scheduler.max_num_batched_tokens) or 0
    total = torch.cuda.get_device_properties(model.device).total_memory
    budget = block_budget(model.spec, total, utilization=config.memory_utilization, weights_bytes=weights,
                          activation_bytes=activations, block_size=config.block_size,
                          kv_format=config.kv_cache_dtype, model_dtype=model.dtype)
    return budget.num_blocks
