"""``CacheConfig``: how the paged KV cache is laid out, how big it is, and what it stores (``kv_cache_dtype``)."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config.checks import require as _require
from workbench_kernels.kv_quant import KV_FORMATS

# What a KV cache may store: the kernels' formats (`workbench_kernels.kv_quant`: auto and the quantized ones), or
# a float dtype named outright, which must then be the model's own (the same as auto).
FLOAT_KV_DTYPES = ("float32", "float16", "bfloat16")
KV_CACHE_DTYPES = (*KV_FORMATS, *FLOAT_KV_DTYPES)
# What a cache can be sized in for any model (no "auto": the sizing tables name the dtype), in the order the lab's
# kv_cache_dtype controls list them; a panel that offers fewer picks from this.
SIZED_KV_DTYPES = (*FLOAT_KV_DTYPES, *KV_FORMATS[1:])

# On the CPU the "device" is the machine's RAM, shared with everything else; a default budget of 1 GiB holds
# ~23k tokens of SmolLM2-135M's fp32 KV (46 KB/token), far more than any notebook workload needs.
DEFAULT_CPU_KV_BUDGET_BYTES = 1 << 30


@dataclass(slots=True, frozen=True)
class CacheConfig:
    """How the paged KV cache is laid out and how big it is.

    ``num_blocks`` fixes the pool size directly; otherwise it follows from ``memory_budget_bytes`` (KV bytes
    to spend) or, on a GPU, from ``memory_utilization`` of the device minus weights and the measured
    activation peak (`workbench.cache.sizing.block_budget`).
    """

    block_size: int = 16
    num_blocks: int | None = None
    memory_budget_bytes: int | None = None
    memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        _require(isinstance(self.block_size, int) and 1 <= self.block_size <= 1024,
                 f"block_size must be an integer in [1, 1024], got {self.block_size!r}")
        _require(self.num_blocks is None or (isinstance(self.num_blocks, int) and self.num_blocks >= 1),
                 f"num_blocks must be an integer >= 1 or None, got {self.num_blocks!r}")
        _require(self.memory_budget_bytes is None or self.memory_budget_bytes > 0,
                 f"memory_budget_bytes must be > 0 or None, got {self.memory_budget_bytes!r}")
        _require(0 < self.memory_utilization <= 1,
                 f"memory_utilization must be in (0, 1], got {self.memory_utilization!r}")
        _require(self.kv_cache_dtype in KV_CACHE_DTYPES,
                 f"unknown kv_cache_dtype {self.kv_cache_dtype!r}: choose one of {list(KV_CACHE_DTYPES)}")
