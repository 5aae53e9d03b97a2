"""How much memory the KV cache takes, and how many sequences fit, computed from the architecture alone.

Every decoder layer keeps one key and one value vector per KV head for every token, so

    KV bytes per token = 2 (K and V) x layers x KV heads x head_dim x bytes per element (+ scales)

The count uses ``num_key_value_heads``, not ``num_attention_heads``: with grouped-query attention several
query heads read the same cached KV head, which is the whole point of GQA (sizing by query heads is the most
common mistake in KV calculators, and a test checks it here).

The block budget follows what serving engines do at start-up: of the device's memory, a utilization share
is usable; the weights and the activation peak of the largest batch are taken off; what is left becomes KV
blocks. Nothing here builds weights, so it works for a 70B config on a laptop.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import pandas as pd
import torch

from workbench.cache.kv_formats import KVFormat, format_bytes_per_token, resolve_kv_format
from workbench.config import ModelSpec


def dtype_bytes(dtype: torch.dtype | str) -> int:
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return torch.empty(0, dtype=dtype).element_size()


def kv_bytes_per_token(spec: ModelSpec, kv_format: str | torch.dtype = torch.bfloat16,
                       model_dtype: torch.dtype = torch.float32) -> int:
    """Bytes of K and V one token occupies across all layers (scales of quantized formats included).

    ``kv_format`` is a torch dtype or a format name (``auto`` = ``model_dtype``, ``fp8_e4m3``, ``int8``,
    ``int4``)."""
    return format_bytes_per_token(spec, resolve_kv_format(kv_format, model_dtype))


def cached_tokens(spec: ModelSpec, context_len: int) -> int:
    """Tokens whose KV must be kept for a context: all of them, or the window for sliding-window attention."""
    return context_len if spec.sliding_window is None else min(context_len, spec.sliding_window)


def kv_bytes(spec: ModelSpec, context_len: int, batch: int = 1, kv_format: str | torch.dtype = torch.bfloat16,
             model_dtype: torch.dtype = torch.float32) -> int:
    """KV bytes for ``batch`` sequences of ``context_len`` tokens each."""
    if context_len < 0 or batch < 0:
        raise ValueError(f"context_len and batch must be >= 0, got {context_len} and {batch}")
    return batch * cached_tokens(spec, context_len) * kv_bytes_per_token(spec, kv_format, model_dtype)


def weight_bytes(spec: ModelSpec, dtype: torch.dtype | str = torch.bfloat16, weight_format: str = "auto") -> int:
    """Bytes of the weights in ``dtype``, or with linear layers in int8 (`workbench.models.int8_linear`):
    ``int8`` stores the decoder's linear weights as one byte each plus a float32 scale per output channel,
    ``int8_all`` the LM head too (a tied head adds its int8 copy: the embedding lookups keep the float table)."""
    total = spec.num_parameters() * dtype_bytes(dtype)
    if weight_format == "auto":
        return total
    if weight_format not in ("int8", "int8_all"):
        raise ValueError(f"unknown weight_format {weight_format!r}: choose one of ['auto', 'int8', 'int8_all']")
    h, inter = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    weights = spec.num_layers * (h * (q + 2 * kv) + q * h + 3 * h * inter)
    channels = spec.num_layers * ((q + 2 * kv) + h + 2 * inter + h)
    total += weights * (1 - dtype_bytes(dtype)) + 4 * channels
    if weight_format == "int8_all":
        head = spec.vocab_size * h
        total += head + 4 * spec.vocab_size - (0 if spec.tie_word_embeddings else head * dtype_bytes(dtype))
    return total


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


@dataclass(frozen=True, slots=True)
class BlockBudget:
    """How a device's memory divides into weights, activations and KV blocks."""

    device_bytes: int
    utilization: float
    usable_bytes: int
    weight_bytes: int
    activation_bytes: int
    kv_budget_bytes: int
    block_size: int
    bytes_per_token: int
    bytes_per_block: int
    num_blocks: int

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def max_concurrency(self, context_len: int) -> int:
        """Sequences of ``context_len`` tokens that fit at once (each rounds up to whole blocks)."""
        return max_concurrency(self.num_blocks, self.block_size, context_len)

    def as_dict(self) -> dict:
        return {**asdict(self), "num_tokens": self.num_tokens}


def block_budget(spec: ModelSpec, device_bytes: int, *, utilization: float = 0.9,
                 weights_bytes: int | None = None, activation_bytes: int = 0, block_size: int = 16,
                 kv_format: str | torch.dtype = torch.bfloat16,
                 model_dtype: torch.dtype = torch.bfloat16) -> BlockBudget:
    """Number of KV blocks that fit: device memory x utilization - weights - activation peak.

    ``weights_bytes`` defaults to the parameter count in ``model_dtype``; pass the measured activation peak
    (`measure_activation_peak`) for the engine's largest batch. Raises if nothing is left for the cache.
    """
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    weights = weight_bytes(spec, model_dtype) if weights_bytes is None else weights_bytes
    usable = int(device_bytes * utilization)
    budget = usable - weights - activation_bytes
    per_token = kv_bytes_per_token(spec, kv_format, model_dtype)
    per_block = per_token * block_size
    if budget < per_block:
        raise ValueError(f"no room for a KV cache: {usable / 2**30:.2f} GiB usable minus {weights / 2**30:.2f} GiB "
                         f"of weights and {activation_bytes / 2**30:.2f} GiB of activations leaves "
                         f"{budget / 2**30:.2f} GiB, less than one block ({per_block:,} B)")
    return BlockBudget(device_bytes, utilization, usable, weights, activation_bytes, budget, block_size, per_token,
                       per_block, budget // per_block)


def max_concurrency(num_blocks: int, block_size: int, context_len: int) -> int:
    """How many sequences of ``context_len`` tokens a pool of ``num_blocks`` blocks holds at once."""
    if context_len < 1:
        raise ValueError(f"context_len must be >= 1, got {context_len}")
    return num_blocks // blocks_for_tokens(context_len, block_size)


def attention_variants(spec: ModelSpec, context_len: int, *, kv_format: str | torch.dtype = torch.bfloat16,
                       window: int = 4096, group_kv_heads: int | None = None) -> pd.DataFrame:
    """The same model's KV memory under MHA, GQA, MQA and sliding-window attention, side by side.

    Only the number of KV heads (or the tokens kept, for SWA) changes; layers, head_dim and dtype stay.
    ``group_kv_heads`` picks the GQA row's KV heads (default: the model's own, or 8 for an MHA model).
    """
    gqa_heads = group_kv_heads or (spec.num_kv_heads if spec.num_kv_heads not in (1, spec.num_heads)
                                   else math.gcd(spec.num_heads, 8))
    variants = [
        ("MHA", spec.replace(num_kv_heads=spec.num_heads, sliding_window=None)),
        ("GQA", spec.replace(num_kv_heads=gqa_heads, sliding_window=None)),
        ("MQA", spec.replace(num_kv_heads=1, sliding_window=None)),
        (f"GQA + SWA {window}", spec.replace(num_kv_heads=gqa_heads, sliding_window=window)),
    ]
    rows = []
    for name, variant in variants:
        per_token = kv_bytes_per_token(variant, kv_format)
        total = kv_bytes(variant, context_len, 1, kv_format)
        rows.append({"variant": name, "kv_heads": variant.num_kv_heads,
                     "query_heads_per_kv_head": variant.group_size,
                     "cached_tokens": cached_tokens(variant, context_len), "bytes_per_token": per_token,
                     "bytes_per_sequence": total, "GiB_per_sequence": total / 2**30})
    frame = pd.DataFrame(rows).set_index("variant")
    frame["vs_MHA"] = frame["bytes_per_sequence"] / frame.loc["MHA", "bytes_per_sequence"]
    return frame


def sizing_table(specs: list[ModelSpec], context_len: int, *, kv_format: str | torch.dtype = torch.bfloat16,
                 weights_dtype: torch.dtype = torch.bfloat16) -> pd.DataFrame:
    """One row per model: KV per token, per sequence at ``context_len``, and next to the weights."""
    rows = []
    for spec in specs:
        fmt: KVFormat = resolve_kv_format(kv_format, weights_dtype)
        per_token = format_bytes_per_token(spec, fmt)
        per_seq = cached_tokens(spec, context_len) * per_token
        weights = weight_bytes(spec, weights_dtype)
        rows.append({"model": spec.name, "attention": spec.attention_kind, "layers": spec.num_layers,
                     "query_heads": spec.num_heads, "kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
                     "kv_bytes_per_token": per_token, "kv_GiB_per_sequence": per_seq / 2**30,
                     "weights_GiB": weights / 2**30, "sequences_equal_to_weights": weights / per_seq})
    return pd.DataFrame(rows).set_index("model")
