"""Validated settings shared by the whole workbench, one module per concern.

Every knob a user can turn lives in one of these slots dataclasses, and each checks itself in
``__post_init__``: a bad value raises ``ValueError`` naming the value and the allowed range, so a mistake in
a notebook cell fails at the line that made it instead of deep inside the engine.

- ``model``: ``ModelSpec``, a Llama-family architecture read from a Hugging Face ``config.json``;
- ``sampling``: ``SamplingParams`` and vLLM's temperature rules;
- ``cache``: ``CacheConfig`` and the KV cache's choices (``KV_CACHE_DTYPES``);
- ``scheduler``: ``SchedulerConfig``;
- ``spec``: ``SpecConfig`` and the bounds speculative decoding shares with requests;
- ``checks``: the one ``require`` they all use.

Import from here (``from workbench.config import SamplingParams``); the modules are how the code is kept.
"""

from workbench.config.cache import (
    DEFAULT_CPU_KV_BUDGET_BYTES,
    FLOAT_KV_DTYPES,
    KV_CACHE_DTYPES,
    SIZED_KV_DTYPES,
    CacheConfig,
)
from workbench.config.model import LAYER_TYPES, ROPE_TYPES, SUPPORTED_MODEL_TYPES, ModelSpec
from workbench.config.sampling import (
    GREEDY_BELOW_TEMPERATURE,
    MAX_LOGPROBS,
    MIN_SAMPLING_TEMPERATURE,
    SamplingParams,
    effective_temperature,
)
from workbench.config.scheduler import BATCHING_MODES, MAX_SCHEDULER_STEPS, SCHEDULING_POLICIES, SchedulerConfig
from workbench.config.spec import (
    MAX_SPECULATIVE_TOKENS,
    MAX_TREE_DEPTH,
    MAX_TREE_NODES,
    SPEC_METHODS,
    SpecConfig,
    static_tree_size,
)

__all__ = [
    "BATCHING_MODES", "DEFAULT_CPU_KV_BUDGET_BYTES", "FLOAT_KV_DTYPES", "GREEDY_BELOW_TEMPERATURE", "KV_CACHE_DTYPES",
    "SIZED_KV_DTYPES",
    "LAYER_TYPES", "MAX_LOGPROBS", "MAX_SCHEDULER_STEPS", "MAX_SPECULATIVE_TOKENS", "MAX_TREE_DEPTH",
    "MAX_TREE_NODES", "MIN_SAMPLING_TEMPERATURE", "ROPE_TYPES", "SCHEDULING_POLICIES", "SPEC_METHODS",
    "SUPPORTED_MODEL_TYPES", "CacheConfig", "ModelSpec", "SamplingParams", "SchedulerConfig", "SpecConfig",
    "effective_temperature", "static_tree_size",
]
