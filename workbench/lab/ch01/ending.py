"""Chapter 1's ending: 'Try this' exercises whose answers the package computes, and the closing table that sets
each of the course's key takeaways beside what the chapter measured and a verdict.

Every verdict is computed from the chapter's own results (`LayerTiming` with full causal attention,
`ContextTTFT`, `AttentionMemory`) and the configs in ``datasets/configs``, by explicit thresholds written next to
each one, so a rerun on another machine can reach a different verdict and say so.
"""

from __future__ import annotations

import torch

from workbench.cache.sizing import cached_tokens, dtype_bytes, kv_bytes, kv_bytes_per_token, weight_bytes
from workbench.lab.ch01.attention_cost import crossover_length, layer_flops, linear_params_per_layer
from workbench.lab.ch01.memory import AttentionMemory
from workbench.lab.ch01.runs import ContextTTFT, LayerTiming
from workbench.lab.kit.closing import ClosingTable, Takeaway, Verdict
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


def exercises() -> dict[str, Exercise]:
    """The chapter's 'Try this' questions, each with its answer computed from the configs."""
    llama = model_spec("llama-3-8b")
    return {
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
            why=f"linear weights per layer ({linear_params_per_layer(llama):,}) divided by the query width "
                f"({llama.num_heads} x {llama.head_dim}): past the config's own {llama.max_position_embeddings:,}-"
                "token limit, so within its context the projections and MLP always cost more FLOPs.",
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




# --------------------------------------------------------------------------------------------- closing table
# A log-log slope above this is growth clearly faster than linear (1) on the way to quadratic (2).
QUADRATIC_SLOPE = 1.5
# A full-context sequence whose KV weighs as much as the weights in fewer sequences than this (a serving batch
# on one node) makes context a cost of the same order as parameters.
SERVING_BATCH = 64


def _quadratic(layer: LayerTiming) -> Takeaway:
    slope, share, n = layer.slopes()["attention"], layer.attention_share, layer.longest
    inside = [name for name in config_names() if (c := crossover_length(model_spec(name))) is not None
              and c <= model_spec(name).max_position_embeddings]
    crossover = layer.crossover()
    overtakes = (f"its FLOPs overtake the linear parts at N ≈ {crossover:,}" if crossover is not None
                 else "its FLOPs never overtake the linear parts")
    return Takeaway(
        "Attention scales quadratically with sequence length: the primary driver of cost at long contexts.",
        f"with {layer.variant}, attention's time grew with log-log slope {slope:.2f} (projections "
        f"{layer.slopes()['qkv + output projections']:.2f}, MLP {layer.slopes()['MLP']:.2f}) and took {share:.0%} "
        f"of a SmolLM2 layer at {n:,} tokens; {overtakes}; the crossover lies "
        f"inside their own context only for {', '.join(inside) or 'no config'} of datasets/configs",
        Verdict.judge(slope > QUADRATIC_SLOPE, caveat=share < 0.5),
        note=("quadratic, but below the crossover the linear parts still cost more: it is the primary driver only "
              "past it, which most configs never reach inside their context" if slope > QUADRATIC_SLOPE
              else f"attention's time grew with slope {slope:.2f}, not faster than about linearly, at these lengths"))


def _heads() -> Takeaway:
    spec = model_spec("smollm2-135m")
    gqa = layer_flops(spec, 4096)["attention"]
    mha = layer_flops(spec.replace(num_kv_heads=spec.num_heads), 4096)["attention"]
    double = layer_flops(spec.replace(num_heads=2 * spec.num_heads, num_kv_heads=2 * spec.num_kv_heads),
                         4096)["attention"]
    return Takeaway(
        "Multi-head attention compounds the compute: every layer, every head, every forward pass.",
        f"attention FLOPs are counted per query head and layer: SmolLM2 with twice the heads needs "
        f"{double / gqa:.1f}x; with {spec.num_kv_heads} or {spec.num_heads} KV heads it needs {gqa / 1e9:.1f} vs "
        f"{mha / 1e9:.1f} GFLOP per layer at 4,096 tokens",
        Verdict.judge(abs(double / gqa - 2) < 1e-6, caveat=gqa == mha),
        note="it is the query heads that multiply the compute; fewer KV heads (GQA, MQA) save memory and "
             "bandwidth, not attention FLOPs")


def _variants() -> Takeaway:
    spec = model_spec("llama-3-8b")
    per = {kv: kv_bytes_per_token(spec.replace(num_kv_heads=kv), torch.bfloat16) for kv in (32, 8, 1)}
    mistral = model_spec("mistral-7b")
    kept = cached_tokens(mistral, 32768)
    return Takeaway(
        "MQA, GQA and SWA exist to reduce KV cache memory, at some quality trade-off.",
        f"Llama-3-8B KV per token: MHA {per[32]:,} B, GQA {per[8]:,} B ({per[32] // per[8]}x less), MQA "
        f"{per[1]:,} B ({per[32] // per[1]}x less); Mistral-7B's {mistral.sliding_window:,}-token window keeps "
        f"{kept:,} of 32,768 tokens",
        Verdict.judge(per[32] > per[8] > per[1] and kept < 32768, caveat=True),
        note="the memory side is computed here; the quality side is not measured in this chapter (it needs "
             "trained models of each variant, which this workbench does not have)")


def _ttft(ttft: ContextTTFT) -> Takeaway:
    grows = ttft.ttft_long_ms > 2 * ttft.ttft_short_ms and ttft.ttft_long_ms > 3 * ttft.decode_ms
    return Takeaway(
        "Time to first token is driven primarily by prefill.",
        f"TTFT {ttft.ttft_short_ms:,.0f} ms at {ttft.shortest:,} prompt tokens, {ttft.ttft_long_ms:,.0f} ms at "
        f"{ttft.longest:,} (log-log slope {ttft.slope:.2f}) = {ttft.steps_per_ttft:.0f} decode steps of "
        f"{ttft.decode_ms:,.0f} ms",
        # Prefill-driven: TTFT grows clearly with the prompt and dwarfs the one decode step's worth of work in it.
        Verdict.judge(grows, caveat=ttft.slope < QUADRATIC_SLOPE),
        note=(f"at these lengths TTFT grows about in proportion to the prompt (slope {ttft.slope:.2f}), not with "
              f"its square: attention is {ttft.attention_flop_share():.0%} of the prefill's FLOPs at "
              f"{ttft.longest:,} tokens" if grows else
              "TTFT did not grow clearly with the prompt here, or stayed within a few decode steps"))


def _context_cost(ttft: ContextTTFT, memory: AttentionMemory) -> Takeaway:
    spec = model_spec("llama-3-70b")
    full = kv_bytes(spec, spec.max_position_embeddings, kv_format=torch.bfloat16)
    sequences = weight_bytes(spec, torch.bfloat16) / full
    holds = sequences <= SERVING_BATCH and ttft.ttft_long_ms > ttft.ttft_short_ms and memory.slope("fused_bytes") > 0
    return Takeaway(
        "Context length is a cost dimension as real as parameter count.",
        f"one full-context ({spec.max_position_embeddings:,}-token) Llama-3-70B sequence holds {full / 2**30:.2f} "
        f"GiB of KV, so {sequences:.0f} of them weigh as much as the weights; TTFT grew "
        f"{ttft.ttft_long_ms / ttft.ttft_short_ms:.0f}x from {ttft.shortest:,} to {ttft.longest:,} tokens; "
        f"materialised scores at {memory.tokens:,} tokens need {memory.ratio:.0f}x a fused layer's memory",
        Verdict.judge(holds),
        note="" if holds else f"here a batch of {SERVING_BATCH} full-context sequences stays below the weights")


def closing_table(layer: LayerTiming, ttft: ContextTTFT, memory: AttentionMemory) -> ClosingTable:
    """The course's chapter-1 takeaways, what this chapter measured for each, and a computed verdict.

    ``layer``: the layer timing with full causal attention (section 3), ``ttft``: the TTFT sweep (section 6),
    ``memory``: the memory sweep (section 7)."""
    return ClosingTable([_quadratic(layer), _heads(), _variants(), _ttft(ttft), _context_cost(ttft, memory)])
