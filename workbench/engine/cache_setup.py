"""How big the engine's KV pool is, decided once at start-up from the cache config and the device.

Order of precedence: an explicit ``num_blocks``; else a ``memory_budget_bytes`` of KV; else, on a GPU, the
serving-engine rule (device memory x utilization - weights - measured activation peak of the largest step);
on the CPU, where the "device memory" is the machine's RAM shared with everything else, a fixed default
budget (`workbench.config.DEFAULT_CPU_KV_BUDGET_BYTES`).
"""

from __future__ import annotations

import torch

from workbench.cache.sizing import block_budget
from workbench.config import DEFAULT_CPU_KV_BUDGET_BYTES, CacheConfig, SchedulerConfig
from workbench.engine.memory_probe import measure_activation_peak
from workbench.models.llama import LlamaModel

_FLOAT_FORMATS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def kv_cache_dtype(config: CacheConfig, model_dtype: torch.dtype) -> torch.dtype:
    """Storage dtype of the paged cache for an unquantized format."""
    if config.kv_cache_dtype == "auto":
        return model_dtype
    if config.kv_cache_dtype in _FLOAT_FORMATS:
        return _FLOAT_FORMATS[config.kv_cache_dtype]
    raise ValueError(f"kv_cache_dtype {config.kv_cache_dtype!r} is not supported by this engine build; "
                     f"choose one of ['auto', {', '.join(map(repr, _FLOAT_FORMATS))}]")


def bytes_per_block(model: LlamaModel, config: CacheConfig) -> int:
    spec = model.spec
    element = torch.empty(0, dtype=kv_cache_dtype(config, model.dtype)).element_size()
    return 2 * spec.num_layers * config.block_size * spec.num_kv_heads * spec.head_dim * element


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
                          kv_format=kv_cache_dtype(config, model.dtype), model_dtype=model.dtype)
    return budget.num_blocks
