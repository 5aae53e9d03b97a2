"""Bytes of KV (and of fixed per-sequence state) for any architecture's layer groups, at any context, batch,
dtype and tensor-parallel degree.

Per layer group (`workbench.cache.kv_layout`):

    full      2 (K, V) x layers x KV heads x head_dim x bytes          per token, every token of the context
    sliding   the same per token, for at most window (+ sink) tokens   bounded by the window
    mla       1 x layers x (kv_lora_rank + qk_rope_head_dim) x bytes   per token: the latent is K and V at once
    linear    layers x state values x state bytes                      per sequence, whatever its length

Under tensor parallelism (TP) each GPU holds, as vLLM lays it out:

- full / sliding: its share of the KV heads (``parallel_sizing.kv_heads_per_rank``: divided while TP <= KV heads,
  replicated beyond);
- mla: **the whole latent**. MLA has a single latent "head" that every query head reads, so TP splits the query
  heads but every rank caches the full 576-wide entry per token (vLLM counts one KV head for MLA models and
  keeps the latent projection replicated). TP buys an MLA model no KV memory per GPU: that is why DeepSeek
  deployments run attention data-parallel instead (TPLA, arXiv 2508.15881: "each device must load the full
  cache");
- linear: a ``1/TP`` slice of the state (vLLM divides the value heads and the convolution channels by TP).

A KV format (``auto``/float names, ``fp8_e4m3``, ``int8``, ``int4``) applies to the token caches, scales
included; linear-attention state keeps its own ``state_dtype`` (vLLM's ``--mamba-ssm-cache-dtype``; bf16 by
default here, float32 doubles the recurrent part).
"""

from __future__ import annotations

import pandas as pd
import torch

from workbench.cache.kv_layout import KVLayout, LayerGroup, kv_layout
from workbench.cache.sizing import dtype_bytes, storage_format
from workbench_kernels.kv_quant import slot_bytes

DEFAULT_CONTEXTS = (8192, 32768, 131072)


def _check_tp(layout: KVLayout, group: LayerGroup, tp: int) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor-parallel degree must be a whole number >= 1, got {tp!r}")
    if layout.num_query_heads % tp:
        raise ValueError(f"tensor-parallel degree {tp} does not fit {layout.name}: its {layout.num_query_heads} "
                         "query heads do not divide into that many ranks")
    if group.kind in ("full", "sliding"):
        heads = group.kv_heads
        if (tp <= heads and heads % tp) or (tp > heads and tp % heads):
            raise ValueError(f"tensor-parallel degree {tp} does not fit {layout.name}'s {heads} KV heads: use a "
                             "divisor or a multiple of them")
    if group.kind == "linear" and (group.tp_split % tp or group.conv_channels % tp):
        raise ValueError(f"tensor-parallel degree {tp} does not divide {layout.name}'s {group.tp_split} "
                         "linear-attention value heads")


def kv_heads_on_rank(group: LayerGroup, tp: int) -> int:
    """KV heads (or MLA's single latent) one rank caches for a token."""
    if group.kind == "mla":
        return 1  # replicated on every rank
    return max(1, group.kv_heads // tp)


def group_bytes_per_token(layout: KVLayout, group: LayerGroup, kv_format: str | torch.dtype = torch.bfloat16,
                          model_dtype: torch.dtype = torch.bfloat16, tp: int = 1) -> int:
    """Bytes one token adds to all layers of ``group`` on one GPU (0 for linear attention)."""
    _check_tp(layout, group, tp)
    if group.kind == "linear":
        return 0
    name, dtype = storage_format(kv_format, model_dtype)
    per_layer = slot_bytes(name, kv_heads_on_rank(group, tp), group.head_dim, dtype)
    return (2 if group.stores_value else 1) * group.num_layers * per_layer


def group_state_bytes(layout: KVLayout, group: LayerGroup, state_dtype: torch.dtype = torch.bfloat16,
                      tp: int = 1) -> int:
    """Bytes of fixed per-sequence state in all layers of ``group`` on one GPU (0 unless linear attention)."""
    _check_tp(layout, group, tp)
    if group.kind != "linear":
        return 0
    return group.num_layers * group.state_elements // tp * dtype_bytes(state_dtype)


def group_rows(layout: KVLayout, context_len: int, *, batch: int = 1,
               kv_format: str | torch.dtype = torch.bfloat16, state_dtype: torch.dtype = torch.bfloat16,
               tp: int = 1) -> pd.DataFrame:
    """One row per layer group: what a token costs, how many are kept at ``context_len``, and the bytes of
    ``batch`` sequences on one GPU; a last row sums them."""
    if batch < 0:
        raise ValueError(f"batch must be >= 0, got {batch}")
    rows = []
    for group in layout.groups:
        per_token = group_bytes_per_token(layout, group, kv_format, state_dtype, tp)
        kept = group.cached_tokens(context_len)
        state = group_state_bytes(layout, group, state_dtype, tp)
        rows.append({"group": group.kind if group.kind != "sliding" else f"sliding {group.window:,}",
                     "layers": group.num_layers, "shape": group.describe(), "bytes_per_token": per_token,
                     "cached_tokens": kept, "state_bytes_per_sequence": state,
                     "bytes_per_sequence": kept * per_token + state})
    frame = pd.DataFrame(rows)
    total = {"group": "total", "layers": layout.num_layers, "shape": "",
             "bytes_per_token": int(frame["bytes_per_token"].sum()), "cached_tokens": context_len,
             "state_bytes_per_sequence": int(frame["state_bytes_per_sequence"].sum()),
             "bytes_per_sequence": int(frame["bytes_per_sequence"].sum())}
    frame = pd.concat([frame, pd.DataFrame([total])], ignore_index=True)
    frame["bytes_for_batch"] = frame["bytes_per_sequence"] * batch
    return frame.set_index("group")


def bytes_per_sequence(layout: KVLayout, context_len: int, *, kv_format: str | torch.dtype = torch.bfloat16,
                       state_dtype: torch.dtype = torch.bfloat16, tp: int = 1) -> int:
    """KV and state bytes one sequence of ``context_len`` tokens holds on one GPU."""
    frame = group_rows(layout, context_len, kv_format=kv_format, state_dtype=state_dtype, tp=tp)
    return int(frame.loc["total", "bytes_per_sequence"])


def sequences_that_fit(layout: KVLayout, context_len: int, kv_budget_bytes: int, *,
                       kv_format: str | torch.dtype = torch.bfloat16, state_dtype: torch.dtype = torch.bfloat16,
                       tp: int = 1) -> int:
    """How many sequences of ``context_len`` tokens fit in ``kv_budget_bytes`` of one GPU's KV memory."""
    if kv_budget_bytes < 0:
        raise ValueError(f"kv_budget_bytes must be >= 0, got {kv_budget_bytes}")
    per = bytes_per_sequence(layout, context_len, kv_format=kv_format, state_dtype=state_dtype, tp=tp)
    return kv_budget_bytes // per if per else 0


def architecture_table(names: list[str], contexts: tuple[int, ...] = DEFAULT_CONTEXTS, *,
                       gpu_bytes: int = 80 * 10**9, utilization: float = 0.9,
                       kv_format: str | torch.dtype = torch.bfloat16, tp: int = 1) -> pd.DataFrame:
    """Per architecture and context: bytes per token (as the cache grows), per sequence, and how many
    sequences' KV alone fit in ``utilization`` of a ``gpu_bytes`` GPU (weights not subtracted: they only lower
    it, and most of these models need several GPUs for their weights)."""
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    budget = int(gpu_bytes * utilization)
    rows = []
    for name in names:
        layout = kv_layout(name)
        for context in contexts:
            per_seq = bytes_per_sequence(layout, context, kv_format=kv_format, tp=tp)
            rows.append({"model": name, "context": context, "bytes_per_sequence": per_seq,
                         "bytes_per_token_average": per_seq / context,
                         "GiB_per_sequence": per_seq / 2**30,
                         "sequences_in_kv_budget": sequences_that_fit(layout, context, budget, kv_format=kv_format,
                                                                      tp=tp)})
    return pd.DataFrame(rows)
