"""Chapter 1's ending: 'Try this' exercises whose answers the package computes, and the closing table that sets
each of the course's key takeaways beside what the chapter measured and a verdict.

Verdicts are computed from the chapter's own results (the layer timing, the TTFT sweep, the memory sweep and
the configs in ``datasets/configs``) by explicit thresholds written next to each one, so a rerun on another
machine can reach a different verdict and say so.
"""

from __future__ import annotations

import pandas as pd
import torch

from workbench.cache.sizing import cached_tokens, dtype_bytes, kv_bytes, kv_bytes_per_token, weight_bytes
from workbench.lab.attention_cost import crossover_length, layer_flops
from workbench.lab.ch01_panels import upper_half_slope
from workbench.lab.kit.exercises import Exercise
from workbench.models import config_names, model_spec


def _flop_ratio(name: str, short: int, long: int) -> float:
    spec = model_spec(name)
    return layer_flops(spec, long)["attention"] / layer_flops(spec, short)["attention"]


def _full_context_kv(name: str) -> int:
    spec = model_spec(name)
    return kv_bytes(spec, spec.max_position_embeddings, kv_format=torch.bfloat16)


def _score_bytes(name: str, n: int) -> int:
    return model_spec(name).num_heads * n * n * dtype_bytes(torch.float32)


EXERCISES: dict[str, Exercise] = {
    "full_context_kv": Exercise(
        "The course's own exercise: how many bytes of KV cache does one Llama-3-70B sequence take at its full "
        "context (max_position_embeddings in datasets/configs/llama-3-70b.json), in bf16?",
        lambda: _full_context_kv("llama-3-70b"), rel_tol=0.0,
        why="2 (K and V) x 80 layers x 8 KV heads x 128 dims x 8,192 tokens x 2 bytes.",
        hint="2 x layers x num_key_value_heads x head_dim x max_position_embeddings x 2 bytes."),
    "attention_growth": Exercise(
        "One SmolLM2 layer, causal prefill: how many times the attention FLOPs of a 4,096-token prompt does a "
        "16,384-token prompt need?",
        lambda: _flop_ratio("smollm2-135m", 4096, 16384), rel_tol=0.01,
        why="a causal prefill scores N(N+1)/2 query-key pairs, so 4x the tokens is about 16x the pairs; the "
            "projections and the MLP only do 4x the work.",
        hint="count query-key pairs, not tokens."),
    "kv_per_token": Exercise(
        "How many bytes of keys and values does one token take in Qwen2.5-7B with a bf16 cache?",
        lambda: kv_bytes_per_token(model_spec("qwen2.5-7b"), torch.bfloat16), rel_tol=0.0,
        why="2 x 28 layers x 4 KV heads x 128 dims x 2 bytes: 28 query heads share 4 KV heads (GQA 7:1).",
        hint="use num_key_value_heads, not num_attention_heads."),
    "crossover": Exercise(
        "At what prompt length would attention's FLOPs equal those of the rest of a Llama-3-8B layer?",
        lambda: crossover_length(model_spec("llama-3-8b")), rel_tol=0.02,
        why="linear weights per layer (218 M) divided by the query width (32 x 128): past the config's own "
            "8,192-token limit, so within its context the projections and MLP always cost more FLOPs.",
        hint="2·N²·q = 2·N·P gives N = P / q; P counts q/k/v/o and the three MLP matrices."),
    "window_tokens": Exercise(
        "Mistral-7B attends over a 4,096-token sliding window. How many tokens' keys and values must be kept "
        "for one 32,768-token sequence?",
        lambda: cached_tokens(model_spec("mistral-7b"), 32768), rel_tol=0.0,
        why="no query ever looks further back than the window, so older keys and values can be dropped.",
        hint="what can the last query still see?"),
    "score_bytes": Exercise(
        "How many bytes does one SmolLM2 layer's materialised score matrix take for an 8,192-token prompt in "
        "fp32?",
        lambda: _score_bytes("smollm2-135m", 8192), rel_tol=0.01,
        why="9 query heads x 8,192 x 8,192 scores x 4 bytes: 2.25 GiB per layer, which a fused kernel never "
            "stores (it keeps one tile of scores at a time).",
        hint="one score per query head, per query, per key."),
}


def _quadratic_row(layer_frame: pd.DataFrame) -> dict[str, str]:
    slope = upper_half_slope(layer_frame, "attention s")
    share = float(layer_frame["attention share"].iloc[-1])
    n = int(layer_frame.index[-1])
    inside = [name for name in config_names() if (c := crossover_length(model_spec(name))) is not None
              and c <= model_spec(name).max_position_embeddings]
    measured = (f"attention's time slope {slope:.2f} (linear parts ~1); {share:.0%} of a SmolLM2 layer at "
                f"{n:,} tokens; FLOP crossover inside the context only for {', '.join(inside) or 'none'}")
    # Quadratic if the slope is clearly above 1.5; 'primary driver' only if it already dominates the layer.
    verdict = ("holds" if slope > 1.5 and share > 0.5 else
               "holds with a caveat: quadratic, but the linear parts cost more below the crossover"
               if slope > 1.5 else "not seen here: attention did not grow faster than linearly")
    return {"measured here": measured, "verdict": verdict}


def _heads_row() -> dict[str, str]:
    spec = model_spec("smollm2-135m")
    gqa = layer_flops(spec, 4096)["attention"]
    mha = layer_flops(spec.replace(num_kv_heads=spec.num_heads), 4096)["attention"]
    measured = (f"attention FLOPs are per query head and layer; SmolLM2 with 3 or 9 KV heads: "
                f"{gqa / 1e9:.1f} vs {mha / 1e9:.1f} GFLOP per layer at 4,096 tokens")
    verdict = ("holds with a caveat: fewer KV heads (GQA) save memory, not attention FLOPs" if gqa == mha
               else "holds")
    return {"measured here": measured, "verdict": verdict}


def _variants_row() -> dict[str, str]:
    spec = model_spec("llama-3-8b")
    per = {kv: kv_bytes_per_token(spec.replace(num_kv_heads=kv), torch.bfloat16) for kv in (32, 8, 1)}
    mistral = model_spec("mistral-7b")
    kept = cached_tokens(mistral, 32768)
    measured = (f"Llama-3-8B KV per token: MHA {per[32]:,} B, GQA {per[8]:,} B ({per[32] // per[8]}x less), MQA "
                f"{per[1]:,} B ({per[32] // per[1]}x less); Mistral's window keeps {kept:,} of 32,768 tokens")
    return {"measured here": measured,
            "verdict": "holds for memory (the quality side is not measured in this chapter)"}


def _ttft_row(ttft_frame: pd.DataFrame) -> dict[str, str]:
    shortest, longest = int(ttft_frame.index[0]), int(ttft_frame.index[-1])
    first, ttft = float(ttft_frame["ttft_ms"].iloc[0]), float(ttft_frame["ttft_ms"].iloc[-1])
    step = float(ttft_frame["decode_step_ms"].median())
    measured = (f"TTFT {first:,.0f} ms at {shortest:,} prompt tokens, {ttft:,.0f} ms at {longest:,} = "
                f"{ttft / step:.0f} decode steps")
    # Prefill-driven: TTFT grows clearly with the prompt and dwarfs the one decode step's worth of work in it.
    verdict = "holds" if ttft > 2 * first and ttft > 3 * step else "not seen here at these lengths"
    return {"measured here": measured, "verdict": verdict}


def _context_cost_row(memory_frame: pd.DataFrame) -> dict[str, str]:
    spec = model_spec("llama-3-70b")
    full = kv_bytes(spec, spec.max_position_embeddings, kv_format=torch.bfloat16)
    weights = weight_bytes(spec, torch.bfloat16)
    last = memory_frame.iloc[-1]
    measured = (f"one full-context Llama-3-70B sequence: {full / 2**30:.2f} GiB of KV, {weights / full:.0f} of them "
                f"weigh as much as the weights; materialised scores at {int(memory_frame.index[-1]):,} tokens: "
                f"{last['materialized_bytes'] / last['fused_bytes']:.0f}x a fused layer's memory")
    return {"measured here": measured,
            "verdict": "holds: memory and prefill time grow with every token of context"}


SEED_TAKEAWAYS = (
    "Attention scales quadratically with sequence length: the primary driver of cost at long contexts.",
    "Multi-head attention compounds the compute: every layer, every head, every forward pass.",
    "MQA, GQA and SWA exist to reduce KV cache memory, at some quality trade-off.",
    "Time to first token is driven primarily by prefill.",
    "Context length is a cost dimension as real as parameter count.",
)


def takeaways(layer_frame: pd.DataFrame, ttft_frame: pd.DataFrame, memory_frame: pd.DataFrame) -> pd.DataFrame:
    """The course's chapter-1 takeaways, what this chapter measured for each, and a verdict.

    ``layer_frame``: `time_layer_parts` with full causal attention; ``ttft_frame``: `ttft_sweep`;
    ``memory_frame``: `attention_memory`."""
    rows = [_quadratic_row(layer_frame), _heads_row(), _variants_row(), _ttft_row(ttft_frame),
            _context_cost_row(memory_frame)]
    frame = pd.DataFrame(rows)
    frame.insert(0, "the seed says", SEED_TAKEAWAYS)
    frame.index = range(1, len(frame) + 1)
    return frame
