"""Chapter 1's seed claims recomputed (`workbench.lab.kit.seed_claims`; the list is datasets/seed_claims/ch01.csv):
each check returns what the configs and the package's arithmetic give for one number or rule of the book."""

from __future__ import annotations

import pandas as pd
import torch

from workbench.cache.sizing import kv_bytes_per_token
from workbench.lab.ch01.ending import crossover_summary
from workbench.lab.kit import seed_claims as kit
from workbench.lab.kit.feasibility import DEVICES
from workbench.models import config_names, model_spec
from workbench.roofline import count_step, decode_work, prefill_work
from workbench.roofline.layer_cost import layer_flops


def _pairs(n: int) -> str:
    return (f"{n * n / 1e6:.1f} M pairs for attention that looks both ways (N²); a causal decoder scores "
            f"{n * (n + 1) // 2 / 1e6:.1f} M (N(N+1)/2), half as many")


def _quadruple() -> str:
    spec = model_spec("smollm2-135m")
    ratio = layer_flops(spec, 8192)["attention"] / layer_flops(spec, 4096)["attention"]
    return f"attention FLOPs 4,096 → 8,192 tokens: {ratio:.2f}x (holds; the projections and MLP: 2.00x)"


def _head_dims() -> str:
    dims = sorted({model_spec(n).head_dim for n in config_names()})
    return f"head_dim across datasets/configs: {', '.join(map(str, dims))} (holds)"


def _contexts() -> str:
    ctx = {n: model_spec(n).max_position_embeddings for n in config_names()}
    return (f"max_position_embeddings across datasets/configs: {min(ctx.values()):,} to {max(ctx.values()):,} "
            f"({sum(v >= 32768 for v in ctx.values())} of {len(ctx)} accept 32K or more); no config here reaches 1M")


def _heads_70b() -> str:
    spec = model_spec("llama-3-70b")
    return (f"Llama-3-70B: {spec.num_heads} query heads, {spec.num_layers} layers (holds), and "
            f"{spec.num_kv_heads} KV heads")


def _ffn_share() -> str:
    spec = model_spec("llama-3-70b")
    h, q, kv, inter = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, \
        spec.intermediate_size
    mlp, attn = 3 * h * inter, h * (q + 2 * kv) + q * h
    return f"Llama-3-70B, one layer: MLP {mlp / (mlp + attn):.0%} of the layer's weights (holds)"


def _long_context_bound() -> str:
    spec, h100 = model_spec("llama-3-8b"), DEVICES["H100 SXM"]
    ridge = h100.bf16_flops / h100.bytes_per_s
    prefill = count_step(spec, prefill_work(8192), dtype=torch.bfloat16).intensity
    decode = count_step(spec, decode_work(1, 8192), dtype=torch.bfloat16).intensity
    return (f"Llama-3-8B, bf16, against an H100's ridge of {ridge:.0f} FLOP/B: an 8,192-token prefill runs at "
            f"{prefill:,.0f} FLOP/B (compute-bound), a decode step at context 8,192 at {decode:.1f} (bandwidth-bound): "
            "wrong for prefill, true for decode (chapter 4)")


def _prompt_4200() -> str:
    return ("4,000 + 200 = 4,200 tokens of prefill without a cache (holds); with the 4,000-token system prompt "
            "cached, 200 are computed, attending over all 4,200")


def _mqa() -> str:
    spec = model_spec("llama-3-8b")
    per = {kv: kv_bytes_per_token(spec.replace(num_kv_heads=kv), torch.bfloat16) for kv in (32, 8, 1)}
    return (f"Llama-3-8B: MQA keeps {per[32] // per[1]}x less than MHA and {per[8] // per[1]}x less than its GQA: the "
            "factor is the number of query heads per KV head removed, not a rule of thumb")


def _gqa_users() -> str:
    gqa = [n for n in config_names() if 1 < model_spec(n).num_kv_heads < model_spec(n).num_heads]
    return f"{len(gqa)} of {len(config_names())} configs use GQA: {', '.join(gqa)}"


def _mistral_window() -> str:
    spec = model_spec("mistral-7b")
    return (f"mistral-7b's config sets one {spec.sliding_window:,}-token window for every one of its "
            f"{spec.num_layers} layers, not for some (later Mistral and Gemma models mix windowed and full layers)")


def _gqa_8x() -> str:
    spec = model_spec("llama-3-70b")
    return f"Llama-3-70B: {spec.num_heads} query heads over {spec.num_kv_heads} KV heads = exactly " \
           f"{spec.num_heads // spec.num_kv_heads}x less cache than MHA (holds)"


def _llama2_70b() -> str:
    spec = model_spec("llama-2-70b")
    return f"wrong: llama-2-70b already uses GQA with {spec.num_kv_heads} KV heads for {spec.num_heads} query heads"


def _superlinear() -> str:
    spec = model_spec("llama-3-8b")
    flops = [sum(layer_flops(spec, n).values()) for n in (4096, 8192)]
    return (f"compute: a Llama-3-8B layer's prefill FLOPs grow {flops[1] / flops[0]:.2f}x from 4,096 to 8,192 tokens "
            "(faster than linearly, barely: the linear parts dominate at this length); memory: the KV cache grows "
            f"linearly ({kv_bytes_per_token(spec, torch.bfloat16):,} bytes per token in bf16, section 8), and with a "
            "fused attention kernel so does the activation peak (section 7); only materialised scores grow with N²")


def _nonlinear_reuse() -> str:
    spec = model_spec("llama-3-8b")
    shares = {n: (lambda f: f["attention"] / sum(f.values()))(layer_flops(spec, n)) for n in (1024, 8192)}
    return (f"attention is {shares[1024]:.1%} of a Llama-3-8B layer's prefill FLOPs at 1,024 tokens and "
            f"{shares[8192]:.1%} at 8,192 (section 4.1): a cached prefix saves mostly linear work (the projections "
            "and the MLP) below the crossover; the nonlinear part matters only at long contexts")


def _batching_attention() -> str:
    return ("set aside here, and loose: batching pays because a step reads the weights once for every sequence in "
            "it, while each sequence's attention still reads its own KV (chapter 4 measures decode steps by batch, "
            "chapter 5 batching itself)")


CHECKS = {"superlinear": _superlinear, "nonlinear_reuse": _nonlinear_reuse,
          "batching_attention": _batching_attention, "pairs_1k": lambda: _pairs(1000),
          "pairs_4k": lambda: _pairs(4000), "pairs_8k": lambda: _pairs(8192),
          "quadruple": _quadruple, "head_dims": _head_dims, "contexts": _contexts, "heads_70b": _heads_70b,
          "ffn_share": _ffn_share, "long_context_bound": _long_context_bound, "prompt_4200": _prompt_4200,
          "mqa": _mqa, "gqa_users": _gqa_users, "mistral_window": _mistral_window, "gqa_8x": _gqa_8x,
          "llama2_70b": _llama2_70b, "crossovers": crossover_summary}


def seed_claims() -> pd.DataFrame:
    """Every number and rule of the book's chapter 1, with what this chapter finds for it."""
    return kit.table("ch01", CHECKS)
