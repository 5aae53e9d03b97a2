"""Chapter 1's crossover verdict redone with 128K-token configs: does attention's cost overtake the rest of the
model *inside* the context the model serves?

Chapter 1 found the crossover (attention FLOPs of a causal prefill = the projections' and MLP's) beyond the
context of most of its configs, and suspected that was an artefact of 8K configs. Here every buildable config is
checked at its own ``max_position_embeddings`` (Llama 3.1 at 131,072 among them), and so are the Llama-block
equivalents of two hybrids: Gemma 3 27B's shapes with its windows on five layers of six, and gpt-oss-120b's
attention with the MLP of the four experts a token is routed to (what one token's FLOPs see). Each layer counts
its own attention: a windowed layer's grows linearly past its window, so the model's crossover is found
numerically on the sum over layers. DeepSeek-V3 (MLA) and Qwen3-Next (linear attention) are not a Llama block:
their attention FLOPs follow other formulas and are left out here.
"""

from __future__ import annotations

import pandas as pd

from workbench.cache.kv_layout import kv_layout
from workbench.config import ModelSpec
from workbench.models import config_names, model_spec
from workbench.roofline.layer_cost import layer_flops

SEARCH_LIMIT = 1 << 26  # 67M tokens: a crossover beyond this counts as never


def _model_flops(spec: ModelSpec, n: int) -> tuple[float, float]:
    """(attention, everything else) FLOPs of a causal prefill of ``n`` tokens over all layers, each layer with
    its own window."""
    attention = other = 0.0
    for window in spec.layer_windows:
        flops = layer_flops(spec, n, window)
        attention += flops["attention"]
        other += flops["qkv + output projections"] + flops["MLP"]
    return attention, other


def model_crossover(spec: ModelSpec) -> int | None:
    """The smallest prompt length at which attention's FLOPs reach the rest's (None: not below SEARCH_LIMIT)."""
    def overtakes(n: int) -> bool:
        attention, other = _model_flops(spec, n)
        return attention >= other

    if not overtakes(SEARCH_LIMIT):
        return None
    low, high = 1, SEARCH_LIMIT  # overtakes(high) holds; grows monotonically with n
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if overtakes(mid) else (mid + 1, high)
    return low


def hybrid_shapes() -> list[ModelSpec]:
    """Llama-block equivalents of Gemma 3 27B (with its windows) and gpt-oss-120b (its routed experts' MLP)."""
    gemma = kv_layout("gemma-3-27b")
    sliding = gemma.group("sliding")
    types = tuple("full_attention" if i % 6 == 5 else "sliding_attention" for i in range(gemma.num_layers))
    oss = kv_layout("gpt-oss-120b")
    oss_types = tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(oss.num_layers))
    return [
        ModelSpec(name="gemma-3-27b (Llama-block shape)", vocab_size=262208, hidden_size=5376,
                  intermediate_size=21504, num_layers=gemma.num_layers, num_heads=gemma.num_query_heads,
                  num_kv_heads=sliding.kv_heads, head_dim=sliding.head_dim,
                  max_position_embeddings=gemma.max_position_embeddings, sliding_window=sliding.window,
                  layer_types=types),
        ModelSpec(name="gpt-oss-120b (4 routed experts as one MLP)", vocab_size=201088, hidden_size=2880,
                  intermediate_size=4 * 2880, num_layers=oss.num_layers, num_heads=oss.num_query_heads,
                  num_kv_heads=8, head_dim=64, max_position_embeddings=oss.max_position_embeddings,
                  sliding_window=128, layer_types=oss_types),
    ]


def crossover_table() -> pd.DataFrame:
    """One row per config: its context, where attention overtakes, whether that is inside the context, and
    attention's share of a full-context prefill's FLOPs."""
    specs = [model_spec(name) for name in config_names()] + hybrid_shapes()
    rows = []
    for spec in specs:
        context = spec.max_position_embeddings
        crossover = model_crossover(spec)
        attention, other = _model_flops(spec, context)
        rows.append({"model": spec.name, "context": context, "windowed_layers": sum(
            w is not None for w in spec.layer_windows), "crossover": crossover,
            "inside_context": crossover is not None and crossover <= context,
            "attention_share_at_context": attention / (attention + other)})
    return pd.DataFrame(rows).set_index("model")


def crossover_verdict(table: pd.DataFrame) -> str:
    """The chapter-1 takeaway's check, redone: for which configs attention overtakes inside their context."""
    long = table[table["context"] >= 131072]
    inside = list(long.index[long["inside_context"]])
    short = table[table["context"] < 131072]
    short_inside = list(short.index[short["inside_context"]])
    windowed = long[long["windowed_layers"] > 0]
    held = list(windowed.index[~windowed["inside_context"]])
    return (f"Of the {len(long)} configs serving 128K tokens, attention overtakes the rest of the model inside "
            f"the context for {len(inside)} ({', '.join(inside) or 'none'}); of the {len(short)} shorter ones, for "
            f"{len(short_inside)} ({', '.join(short_inside) or 'none'}). Of the {len(windowed)} with sliding-window "
            f"layers, {len(held)} keep attention below the rest ({', '.join(held) or 'none'}): windowed layers' "
            "attention grows only linearly, so it is the full-attention layers' share that decides.")
