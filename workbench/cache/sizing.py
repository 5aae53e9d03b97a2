"""How much memory the KV cache takes, how many blocks a pool gets, and how many sequences fit.

Every decoder layer keeps one key and one value vector per KV head for every token, so

    KV bytes per token = 2 (K and V) x layers x KV heads x head_dim x bytes per element (+ scales)

The count uses ``num_key_value_heads``, not ``num_attention_heads``: with grouped-query attention several
query heads read the same cached KV head, which is the whole point of GQA (sizing by query heads is the most
common mistake in KV calculators, and a test checks it here). The bytes of one cache slot in each KV format
come from the kernels' own layout table (`workbench_kernels.kv_quant.cache_shapes`), scales included:

    auto       the model's own dtype (fp32 on the CPU here, bf16 on a GPU); no scales
    fp8_e4m3   8-bit floats; one static scale per (layer, KV head), too small to count per token
    int8       8-bit integers, symmetric, one float16 scale per token per KV head
    int4       4-bit integers packed two per byte, groups of 32 values with a float16 scale and zero point

The engine's pool, decided once at start-up (``num_blocks_for``): an explicit ``num_blocks``; else a
``memory_budget_bytes`` of KV; else, on a GPU, what serving engines do (device memory x utilization - weights -
the measured activation peak of the largest step); on the CPU, whose "device memory" is the RAM everything
else shares, a fixed default budget. The same arithmetic sizes a 70B config on a laptop (``block_budget``).
The activation peak is measured the way serving engines do it: run the largest step once and read the memory
high-water mark (CUDA's allocator statistics; on Linux CPUs the process's peak resident set, VmHWM, which
``/proc/self/clear_refs`` resets; elsewhere it is not measurable and the probe returns None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from workbench.cache.kv_groups import KVGroupLayout
from workbench.config import DEFAULT_CPU_KV_BUDGET_BYTES, FLOAT_KV_DTYPES, KV_CACHE_DTYPES, CacheConfig, ModelSpec
from workbench.intmath import ceil_div
from workbench.models.attention import NoCacheAttention
from workbench.models.llama import LlamaModel
from workbench_kernels.kv_quant import KV_FORMATS, slot_bytes


def dtype_bytes(dtype: torch.dtype | str) -> int:
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return torch.empty(0, dtype=dtype).element_size()


def storage_format(kv_format: str | torch.dtype, model_dtype: torch.dtype = torch.float32) -> tuple[str, torch.dtype]:
    """(the kernels' format name, the activations' dtype) for a format name or a torch dtype: ``auto`` and
    float names store floats (``auto`` in the model's dtype), the quantized names store themselves."""
    if isinstance(kv_format, torch.dtype):
        if str(kv_format).removeprefix("torch.") not in FLOAT_KV_DTYPES:
            raise ValueError(f"KV dtype {kv_format} is not supported; use one of {list(FLOAT_KV_DTYPES)}")
        return "auto", kv_format
    if kv_format in FLOAT_KV_DTYPES:
        return "auto", getattr(torch, kv_format)
    if kv_format not in KV_FORMATS:
        raise ValueError(f"unknown kv_cache_dtype {kv_format!r}: choose one of {list(KV_CACHE_DTYPES)}")
    return kv_format, model_dtype


def kv_bytes_per_token(spec: ModelSpec, kv_format: str | torch.dtype = torch.bfloat16,
                       model_dtype: torch.dtype = torch.float32) -> int:
    """Bytes of K and V one token occupies across all layers (scales of quantized formats included).

    ``kv_format`` is a torch dtype or a format name (``auto`` = ``model_dtype``, ``fp8_e4m3``, ``int8``,
    ``int4``, or a float name)."""
    name, dtype = storage_format(kv_format, model_dtype)
    return 2 * spec.num_layers * slot_bytes(name, spec.num_kv_heads, spec.head_dim, dtype)


def cached_tokens(spec: ModelSpec, context_len: int) -> int:
    """Tokens whose KV must be kept for a context: all of them, or the window for sliding-window attention."""
    return context_len if spec.sliding_window is None else min(context_len, spec.sliding_window)


def kv_bytes(spec: ModelSpec, context_len: int, batch: int = 1, kv_format: str | torch.dtype = torch.bfloat16,
             model_dtype: torch.dtype = torch.float32) -> int:
    """KV bytes for ``batch`` sequences of ``context_len`` tokens each, each layer keeping what its own window
    lets it (``ModelSpec.layer_windows``)."""
    if context_len < 0 or batch < 0:
        raise ValueError(f"context_len and batch must be >= 0, got {context_len} and {batch}")
    per_layer = kv_bytes_per_token(spec, kv_format, model_dtype) // spec.num_layers
    kept = sum(context_len if w is None else min(context_len, w) for w in spec.layer_windows)
    return batch * kept * per_layer


def weight_bytes(spec: ModelSpec, dtype: torch.dtype | str = torch.bfloat16, weight_format: str = "auto") -> int:
    """Bytes of the weights in ``dtype``, or with linear layers in int8 (`workbench.models.int8_linear`):
    ``int8`` stores the decoder's linear weights as one byte each plus a float32 scale per output channel,
    ``int8_all`` the LM head too (a tied head adds its int8 copy: the embedding lookups keep the float table);
    or in GGUF blocks (`workbench.models.gguf_linear`): ``q4_1`` 20 bytes per 32 decoder weights and a Q8_0
    head (34 bytes per 32), ``q8_0`` Q8_0 for both."""
    total = spec.num_parameters() * dtype_bytes(dtype)
    if weight_format == "auto":
        return total
    if weight_format not in ("int8", "int8_all", "q4_1", "q8_0"):
        raise ValueError(f"unknown weight_format {weight_format!r}: choose one of "
                         "['auto', 'int8', 'int8_all', 'q4_1', 'q8_0']")
    h, inter = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    weights = spec.num_layers * (h * (q + 2 * kv) + q * h + 3 * h * inter)
    if weight_format in ("q4_1", "q8_0"):
        return total + _gguf_extra_bytes(spec, dtype, weight_format, weights)
    channels = spec.num_layers * ((q + 2 * kv) + h + 2 * inter + h)
    total += weights * (1 - dtype_bytes(dtype)) + 4 * channels
    if weight_format == "int8_all":
        head = spec.vocab_size * h
        total += head + 4 * spec.vocab_size - (0 if spec.tie_word_embeddings else head * dtype_bytes(dtype))
    return total


# Bytes per 32-weight block of each GGUF format (`workbench_kernels.gguf_matmul.FORMATS`) and the head's format.
_GGUF_BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}


def _gguf_extra_bytes(spec: ModelSpec, dtype: torch.dtype | str, weight_format: str, decoder_weights: int) -> int:
    """What GGUF blocks change from all-float weights: the decoder's linear weights become blocks of
    ``weight_format``, the LM head Q8_0 blocks (a tied head adds them: the lookup keeps the float table)."""
    head = spec.vocab_size * spec.hidden_size
    blocks = decoder_weights // 32 * _GGUF_BLOCK_BYTES[weight_format] + head // 32 * _GGUF_BLOCK_BYTES["q8_0"]
    float_linear = decoder_weights + (0 if spec.tie_word_embeddings else head)
    return blocks - float_linear * dtype_bytes(dtype)


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    return ceil_div(num_tokens, block_size)


def max_concurrency(num_blocks: int, block_size: int, context_len: int) -> int:
    """How many sequences of ``context_len`` tokens a pool of ``num_blocks`` blocks holds at once."""
    if context_len < 1:
        raise ValueError(f"context_len must be >= 1, got {context_len}")
    return num_blocks // blocks_for_tokens(context_len, block_size)


# ------------------------------------------------------------------------------------------------ budgets
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


# --------------------------------------------------------------------------------------- the engine's pool
def kv_format_for(config: CacheConfig, model_dtype: torch.dtype) -> str:
    """The kernels' format name for a cache config (a float name must be the model's own dtype)."""
    name, dtype = storage_format(config.kv_cache_dtype, model_dtype)
    if dtype != model_dtype:
        raise ValueError(f"kv_cache_dtype {config.kv_cache_dtype!r} differs from the model's dtype {model_dtype}: use "
                         f"'auto' (the model's dtype) or a quantized format {list(KV_FORMATS[1:])}")
    return name


def bytes_per_block(model: LlamaModel, config: CacheConfig, layout: KVGroupLayout | None = None) -> int:
    """Bytes one block of the engine's pool takes across all layers, K and V, scales included; with KV groups
    (`workbench.cache.kv_groups`) a block holds one group's layers only."""
    kv_format_for(config, model.dtype)
    per_token = kv_bytes_per_token(model.spec, config.kv_cache_dtype, model.dtype)
    if layout is not None:
        per_token = per_token // model.spec.num_layers * layout.tensors_per_block
    return per_token * config.block_size


def num_blocks_for(model: LlamaModel, config: CacheConfig, max_num_batched_tokens: int,
                   layout: KVGroupLayout | None = None) -> int:
    """The engine's pool size (module docstring: explicit, a KV budget, or what a GPU's memory leaves)."""
    if config.num_blocks is not None:
        return config.num_blocks
    per_block = bytes_per_block(model, config, layout)
    if config.memory_budget_bytes is not None or model.device.type != "cuda":
        budget = config.memory_budget_bytes or DEFAULT_CPU_KV_BUDGET_BYTES
        if budget < per_block:
            raise ValueError(f"memory_budget_bytes {budget} is smaller than one block ({per_block} bytes)")
        return budget // per_block
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    activations = measure_activation_peak(model, max_num_batched_tokens) or 0
    total = torch.cuda.get_device_properties(model.device).total_memory
    budget = block_budget(model.spec, total, utilization=config.memory_utilization, weights_bytes=weights,
                          activation_bytes=activations, block_size=config.block_size,
                          kv_format=config.kv_cache_dtype, model_dtype=model.dtype)
    return budget.kv_budget_bytes // per_block


def _rss_field(name: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_cpu_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # "5" resets the peak RSS to the current RSS
        return True
    except OSError:
        return False


@torch.inference_mode()
def measure_activation_peak(model: LlamaModel, num_tokens: int) -> int | None:
    """Peak bytes a forward over ``num_tokens`` prompt tokens needs beyond what is already allocated."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    ids = torch.randint(0, model.spec.vocab_size, (num_tokens,), device=model.device)
    positions = torch.arange(num_tokens, device=model.device)

    def forward() -> None:
        hidden = model(ids, positions, NoCacheAttention([num_tokens], model.attention_scale))
        model.compute_logits(hidden[-1:])

    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
        before = torch.cuda.memory_allocated(model.device)
        torch.cuda.reset_peak_memory_stats(model.device)
        forward()
        torch.cuda.synchronize(model.device)
        return torch.cuda.max_memory_allocated(model.device) - before
    if model.device.type == "cpu" and _reset_cpu_peak():
        before = _rss_field("VmRSS")
        forward()
        peak = _rss_field("VmHWM")
        if before is not None and peak is not None:
            return max(peak - before, 0)
    return None


# ----------------------------------------------------------------------------------------- comparisons
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
        per_token = kv_bytes_per_token(spec, kv_format, weights_dtype)
        per_seq = cached_tokens(spec, context_len) * per_token
        weights = weight_bytes(spec, weights_dtype)
        rows.append({"model": spec.name, "attention": spec.attention_kind, "layers": spec.num_layers,
                     "query_heads": spec.num_heads, "kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
                     "kv_bytes_per_token": per_token, "kv_GiB_per_sequence": per_seq / 2**30,
                     "weights_GiB": weights / 2**30, "sequences_equal_to_weights": weights / per_seq})
    return pd.DataFrame(rows).set_index("model")
