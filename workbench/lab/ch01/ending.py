"""Chapter 1's ending: 'Try this' exercises whose answers the package computes, and the closing table that sets
each of the book's key takeaways beside what the chapter measured and a verdict.

Every verdict is computed from the chapter's own results (`LayerTiming` with full causal attention,
`ContextTTFT`, `AttentionMemory`) and the configs in ``datasets/configs``, by explicit thresholds written next to
each one, so a rerun on another machine can reach a different verdict and say so.
"""

from __future__ import annotations

import json
import math

import torch

from workbench.cache.sizing import cached_tokens, dtype_bytes, kv_bytes, kv_bytes_per_token, weight_bytes
from workbench.lab.ch01.memory import AttentionMemory
from workbench.lab.ch01.runs import ContextTTFT, LayerTiming
from workbench.lab.kit.closing import ClosingTable, Takeaway
from workbench.lab.kit.contention import Contention, busy_takeaway
from workbench.lab.kit.evidence import Evidence
from workbench.lab.kit.exercises import Exercise
from workbench.models import config_names, model_spec
from workbench.paths import CONFIGS_DIR
from workbench.roofline.layer_cost import crossover_length, layer_flops, linear_params_per_layer


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
            "The book's own exercise: how many bytes of KV cache does one Llama-3-70B sequence take at its full "
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
                f"({llama.num_heads} x {llama.head_dim}): past this config's own {llama.max_position_embeddings:,}-"
                "token limit, so within its context the projections and MLP always cost more FLOPs"
                + (f"; {', '.join(_same_shapes_longer_context('llama-3-8b'))} (the same shapes, a longer context) "
                   "reach it" if _same_shapes_longer_context("llama-3-8b") else "") + ".",
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
# Per doubling of N a linear part's time doubles and a quadratic one's quadruples: the claim is read against the
# geometric midpoint, 2^1.5 (a log-log slope of 1.5).
MIDPOINT_GROWTH = 2**1.5
# A full-context sequence whose KV weighs as much as the weights in fewer sequences than this makes context a cost
# of the same order as parameters: 64 is a modest batch for one serving node (vLLM's default max_num_seqs is
# larger), so a node that fills it holds more KV than weights.
SERVING_BATCH = 64


def configs_past_crossover() -> tuple[list[str], list[str]]:
    """(configs whose FLOP crossover lies inside their own context, all configs) of datasets/configs."""
    names = config_names()
    inside = [name for name in names if (c := crossover_length(model_spec(name))) is not None
              and c <= model_spec(name).max_position_embeddings]
    return inside, names


def crossover_summary() -> str:
    """Which configs reach attention's FLOP crossover inside their own context, computed from the configs."""
    inside, names = configs_past_crossover()
    beyond = [n for n in names if n not in inside]
    return (f"{len(inside)} of {len(names)} configs reach the crossover inside their own context: "
            + ", ".join(f"{n} (at {crossover_length(model_spec(n)):,} of {model_spec(n).max_position_embeddings:,})"
                        for n in inside)
            + f"; for the other {len(beyond)} ({', '.join(beyond)}) the linear parts cost more FLOPs at every "
              "length the model accepts")


def read_config(name: str) -> dict:
    """A config of ``datasets/configs`` as its JSON (the fields the book's exercise reads)."""
    return json.loads((CONFIGS_DIR / f"{name}.json").read_text())


def _doubling(layer: LayerTiming) -> float:
    """Attention's time growth per doubling of N between the two longest lengths."""
    times, lengths = layer.frame["attention s"], layer.frame.index
    return float(times.iloc[-1] / times.iloc[-2]) ** (math.log(2) / math.log(lengths[-1] / lengths[-2]))


def _same_shapes_longer_context(name: str) -> list[str]:
    """Configs with ``name``'s crossover (the same layer shapes) whose context reaches it."""
    crossover = crossover_length(model_spec(name))
    return [other for other in config_names() if crossover_length(model_spec(other)) == crossover
            and model_spec(other).max_position_embeddings >= (crossover or 0)]


def _quadratic(layer: LayerTiming) -> Takeaway:
    slope, share, n = layer.slopes()["attention"], layer.attention_share, layer.longest
    inside, names = configs_past_crossover()
    crossover = layer.crossover()
    overtakes = (f"its FLOPs overtake the linear parts at N ≈ {crossover:,}" if crossover is not None
                 else "its FLOPs never overtake the linear parts")
    firsts = ", ".join(f"{name} at {crossover_length(model_spec(name)):,}" for name in inside)
    growth = Evidence.repeats(f"attention time per doubling of N ({layer.frame.index[-2]:,} → {n:,} tokens)",
                              [_doubling(layer)], null=MIDPOINT_GROWTH, n_label="timing (fastest of 3 calls)",
                              unit="x")
    reach = Evidence.exact("configs whose FLOP crossover lies inside their context", len(inside), 0,
                           n=len(names), n_label=f"{len(names)} configs", unit="")
    return Takeaway.judged(
        "Attention scales quadratically with sequence length: the primary driver of cost at long contexts.",
        f"with {layer.variant}, attention's time grew with log-log slope {slope:.2f} (projections "
        f"{layer.slopes()['qkv + output projections']:.2f}, MLP {layer.slopes()['MLP']:.2f}) and took {share:.0%} "
        f"of a SmolLM2 layer at {n:,} tokens; {overtakes}; the FLOP crossover lies inside the config's own context "
        f"for {len(inside)} of {len(names)} configs of datasets/configs ({firsts or 'none'})",
        [growth, reach], caveat=len(inside) < len(names),
        caveat_note=f"quadratic, but the larger part of a prefill's FLOPs only past the FLOP crossover (tens of "
                    f"thousands of tokens for 7B-70B models): {len(inside)} of {len(names)} configs reach it inside "
                    "their context (the long-context ones); below it the projections and MLP cost more FLOPs. Time "
                    f"is another matter: on this device attention took {share:.0%} of the layer's time at {n:,} "
                    f"tokens against {layer.flop_shares()[-1]:.0%} of its FLOPs (its kernel does less work per "
                    "second than the matrix products); and a decode step is paid in bytes, where attention's cost is "
                    "reading the KV (chapter 2)",
        wrong_note="attention's time did not grow clearly faster than linearly at these lengths, or no config "
                   "reaches its crossover inside its context")


def _heads() -> Takeaway:
    spec = model_spec("smollm2-135m")
    gqa = layer_flops(spec, 4096)["attention"]
    mha = layer_flops(spec.replace(num_kv_heads=spec.num_heads), 4096)["attention"]
    double = layer_flops(spec.replace(num_heads=2 * spec.num_heads, num_kv_heads=2 * spec.num_kv_heads),
                         4096)["attention"]
    return Takeaway.judged(
        "Multi-head attention compounds the compute: every layer, every head, every forward pass.",
        f"attention FLOPs are counted per query head and layer: SmolLM2 with twice the heads needs "
        f"{double / gqa:.1f}x; with {spec.num_kv_heads} or {spec.num_heads} KV heads it needs {gqa / 1e9:.1f} vs "
        f"{mha / 1e9:.1f} GFLOP per layer at 4,096 tokens",
        Evidence.exact("attention FLOPs with twice the heads", double / gqa, 1.0),
        caveat=gqa == mha,
        caveat_note="it is the query heads that multiply the compute; fewer KV heads (GQA, MQA) save memory and "
                    "bandwidth, not attention FLOPs",
        wrong_note="twice the heads did not need more attention FLOPs")


def _variants() -> Takeaway:
    spec = model_spec("llama-3-8b")
    per = {kv: kv_bytes_per_token(spec.replace(num_kv_heads=kv), torch.bfloat16) for kv in (32, 8, 1)}
    mistral = model_spec("mistral-7b")
    kept = cached_tokens(mistral, 32768)
    return Takeaway.judged(
        "MQA, GQA and SWA exist to reduce KV cache memory, at some quality trade-off.",
        f"Llama-3-8B KV per token: MHA {per[32]:,} B, GQA {per[8]:,} B ({per[32] // per[8]}x less), MQA "
        f"{per[1]:,} B ({per[32] // per[1]}x less); Mistral-7B's {mistral.sliding_window:,}-token window keeps "
        f"{kept:,} of 32,768 tokens",
        [Evidence.exact("MHA / GQA KV bytes per token", per[32] / per[8], 1.0),
         Evidence.exact("GQA / MQA KV bytes per token", per[8] / per[1], 1.0),
         Evidence.exact("tokens kept without / with the window", 32768 / kept, 1.0)],
        caveat=True,
        caveat_note="the memory side is computed here; the quality side is not measured in this chapter (it needs "
                    "trained models of each variant, which this workbench does not have)",
        wrong_note="a variant did not keep fewer bytes than the one it replaces")


def _ttft(ttft: ContextTTFT) -> Takeaway:
    growth = Evidence.repeats(f"TTFT at {ttft.longest:,} / at {ttft.shortest:,} prompt tokens",
                              ttft.runs_ms("ttft", -1), ttft.runs_ms("ttft", 0), null=2.0)
    over_decode = Evidence.repeats(f"TTFT at {ttft.longest:,} tokens / one decode step", ttft.runs_ms("ttft", -1),
                                   ttft.runs_ms("decode", -1), null=3.0)
    return Takeaway.judged(
        "Time to first token is driven primarily by prefill.",
        f"TTFT {ttft.ttft_short_ms:,.0f} ms at {ttft.shortest:,} prompt tokens, {ttft.ttft_long_ms:,.0f} ms at "
        f"{ttft.longest:,} (log-log slope {ttft.slope:.2f}) = {ttft.steps_per_ttft:.0f} decode steps of "
        f"{ttft.decode_ms:,.0f} ms",
        # Prefill-driven: TTFT grows clearly with the prompt and dwarfs the one decode step's worth of work in it.
        [growth, over_decode], caveat=ttft.slope < 1.5,
        caveat_note=f"at these lengths TTFT grows about in proportion to the prompt (slope {ttft.slope:.2f}), not "
                    f"with its square: attention is {ttft.attention_flop_share():.0%} of the prefill's FLOPs at "
                    f"{ttft.longest:,} tokens",
        wrong_note="TTFT did not grow clearly with the prompt here, or stayed within a few decode steps")


def _context_cost(ttft: ContextTTFT, memory: AttentionMemory) -> Takeaway:
    spec = model_spec("llama-3-70b")
    full = kv_bytes(spec, spec.max_position_embeddings, kv_format=torch.bfloat16)
    sequences = weight_bytes(spec, torch.bfloat16) / full
    return Takeaway.judged(
        "Context length is a cost dimension as real as parameter count.",
        f"one full-context ({spec.max_position_embeddings:,}-token) Llama-3-70B sequence holds {full / 2**30:.2f} "
        f"GiB of KV, so {sequences:.0f} of them weigh as much as the weights; TTFT grew "
        f"{ttft.ttft_long_ms / ttft.ttft_short_ms:.0f}x from {ttft.shortest:,} to {ttft.longest:,} tokens; "
        f"materialised scores at {memory.tokens:,} tokens need {memory.ratio:.0f}x a fused layer's memory",
        [Evidence.exact(f"full-context sequences that weigh as much as the weights (a serving batch of "
                        f"{SERVING_BATCH} holds more)", sequences, SERVING_BATCH, expect="below", unit=""),
         Evidence.repeats(f"TTFT at {ttft.longest:,} / at {ttft.shortest:,} tokens", ttft.runs_ms("ttft", -1),
                          ttft.runs_ms("ttft", 0), null=1.0)],
        wrong_note=f"here a batch of {SERVING_BATCH} full-context sequences stays below the weights")


def closing_table(layer: LayerTiming, ttft: ContextTTFT, memory: AttentionMemory, *,
                  layer_contention: Contention | None = None,
                  ttft_contention: Contention | None = None) -> ClosingTable:
    """The book's chapter-1 takeaways, what this chapter measured for each, and a computed verdict.

    ``layer``: the layer timing with full causal attention (section 3), ``ttft``: the TTFT sweep (section 6),
    ``memory``: the memory sweep (section 7). ``layer_contention`` / ``ttft_contention``: those two panels'
    readings (``panel.contention`` of the run the result came from): a row judged from their timings says "the
    machine was busy" instead of concluding when its reading was busy; the rows from counts do not read them."""
    return ClosingTable([busy_takeaway(_quadratic(layer), layer_contention), _heads(), _variants(),
                         busy_takeaway(_ttft(ttft), ttft_contention),
                         busy_takeaway(_context_cost(ttft, memory), ttft_contention)])
