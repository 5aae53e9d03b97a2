"""How much memory the KV cache takes, computed from a model's architecture alone.

Every decoder layer keeps one key and one value vector per KV head for every token, so

    KV bytes per token = 2 (K and V) x layers x KV heads x head_dim x bytes per element.

The count uses ``num_key_value_heads``, not ``num_attention_heads``: with grouped-query attention several
query heads read the same cached KV head, which is the whole point of GQA (sizing by query heads is the most
common mistake in KV calculators, and a test checks it here).
"""

from __future__ import annotations

import torch

from workbench.config import ModelSpec


def dtype_bytes(dtype: torch.dtype | str) -> int:
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return torch.empty(0, dtype=dtype).element_size()


def kv_bytes_per_token(spec: ModelSpec, dtype: torch.dtype | str = torch.bfloat16) -> int:
    """Bytes of K and V one token occupies across all layers, stored in ``dtype``."""
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * dtype_bytes(dtype)
