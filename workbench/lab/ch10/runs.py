"""Chapter 10's measurements, without widgets: floating-point order on a tiny example, which of the model's
products round differently with the batch, the divergence experiment, and the cached 200-run result.

The experiment itself lives engine-side (`workbench.quality.determinism`, the mode in
`workbench.models.row_invariant` and `workbench.cache.invariant_attention`); this module shapes what the chapter
shows from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from workbench.models.cpu_linear import Linear
from workbench.models.row_invariant import row_invariant_products
from workbench.prompts import encode_prompt
from workbench.quality.determinism import (
    COST_PROMPTS,
    PROMPT,
    DivergenceReport,
    divergence_experiment,
    mode_cost,
    summary,
)

CACHED = Path(__file__).resolve().parents[3] / "datasets" / "determinism" / "divergence.json"


def summation_orders(count: int = 1000, seed: int = 0) -> pd.DataFrame:
    """The same ``count`` float32 numbers summed in four orders a kernel might use; the float64 sum beside them.

    Each order is a legitimate way to add the numbers; they give different float32 results because every
    addition rounds, and the rounding depends on what has been added so far."""
    values = np.random.default_rng(seed).standard_normal(count).astype(np.float32) * np.float32(100)
    exact = float(np.sum(values.astype(np.float64)))

    def left_to_right(v: np.ndarray) -> np.float32:
        total = np.float32(0)
        for x in v:
            total = np.float32(total + x)
        return total

    def in_lanes(v: np.ndarray, lanes: int) -> np.float32:  # what a vectorized loop does: lanes, then across
        padded = np.concatenate([v, np.zeros(-len(v) % lanes, np.float32)]).reshape(-1, lanes)
        partial = np.zeros(lanes, np.float32)
        for row in padded:
            partial = (partial + row).astype(np.float32)
        return left_to_right(partial)

    orders = {"left to right": left_to_right(values), "right to left": left_to_right(values[::-1]),
              "8 lanes (AVX2)": in_lanes(values, 8), "16 lanes (AVX-512)": in_lanes(values, 16)}
    return pd.DataFrame([{"order": name, "float32 sum": float(total), "error vs exact": float(total) - exact}
                         for name, total in orders.items()])


@dataclass(frozen=True, slots=True)
class ProductCheck:
    """For each linear layer of the model: does a row computed alone equal the same row inside a batch?"""

    frame: pd.DataFrame  # layer, shape, rows in the batch, identical, max_abs_diff, identical in the mode

    @property
    def layers_that_differ(self) -> list[str]:
        return sorted(set(self.frame.loc[~self.frame["identical"], "layer"]))

    @property
    def mode_is_identical(self) -> bool:
        return bool(self.frame["identical in the mode"].all())


def product_check(model, batch_sizes: tuple[int, ...] = (2, 8, 32, 128), seed: int = 0) -> ProductCheck:
    """Each distinct linear layer of the model's first decoder layer and the LM head, as the engine runs it
    (packed for oneDNN on the CPU), on random rows: the first row alone vs the same row among ``M - 1`` others."""
    layer = model.layers[0]
    layers = {"qkv_proj": layer.qkv_proj, "o_proj": layer.o_proj, "gate_up_proj": layer.gate_up_proj,
              "down_proj": layer.down_proj, "lm_head": model.lm_head}
    generator = torch.Generator().manual_seed(seed)
    rows = []
    with torch.inference_mode():
        for name, module in layers.items():
            assert isinstance(module, Linear)
            x = torch.randn(max(batch_sizes), module.in_features, generator=generator, dtype=model.dtype)
            alone = module(x[:1])
            with row_invariant_products():
                alone_tiled = module(x[:1])
            for m in batch_sizes:
                diff = float((module(x[:m])[:1] - alone).abs().max())
                with row_invariant_products():
                    tiled = float((module(x[:m])[:1] - alone_tiled).abs().max())
                rows.append({"layer": name, "shape": f"{module.out_features}x{module.in_features}",
                             "rows in the batch": m, "identical": diff == 0.0, "max_abs_diff": diff,
                             "identical in the mode": tiled == 0.0})
    return ProductCheck(pd.DataFrame(rows))


def attention_paths(model, context: int = 200, seed: int = 0) -> pd.DataFrame:
    """The same query row through PyTorch's attention three ways the engine calls it (a decode step, inside a
    whole prefill, inside a chunk) and through the batch-invariant attention, each compared with its own
    decode-step result."""
    from workbench.cache.invariant_attention import invariant_attention
    from workbench.models.attention import causal_attention

    spec = model.spec
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(context, spec.num_heads, spec.head_dim, generator=g)
    k = torch.randn(context, spec.num_kv_heads, spec.head_dim, generator=g)
    v = torch.randn(context, spec.num_kv_heads, spec.head_dim, generator=g)
    scale, p = spec.head_dim ** -0.5, context - 1
    chunk = slice(p - 15, p + 1)
    default = {"decode step": causal_attention(q[p:p + 1], k, v, scale)[0],
               "inside a whole prefill": causal_attention(q, k, v, scale)[p],
               "inside a 16-token chunk": causal_attention(q[chunk], k, v, scale)[-1]}
    kt, vt = k.transpose(0, 1), v.transpose(0, 1)
    invariant = {"decode step": invariant_attention(q[p:p + 1], torch.tensor([p]), kt, vt, scale)[0],
                 "inside a whole prefill": invariant_attention(q, torch.arange(context), kt, vt, scale)[p],
                 "inside a 16-token chunk": invariant_attention(q[chunk], torch.arange(p - 15, p + 1), kt, vt,
                                                                scale)[-1]}
    return pd.DataFrame([{"path": path, "default: max diff vs decode": float((default[path] - default["decode step"])
                                                                              .abs().max()),
                          "batch-invariant: max diff vs decode": float((invariant[path] - invariant["decode step"])
                                                                       .abs().max())}
                         for path in default])


def live_divergence(model, tokenizer, prompt_ids: list[int], *, runs: int, max_tokens: int, max_others: int,
                    kv_cache_dtype: str, progress=None) -> dict[bool, DivergenceReport]:
    """The experiment with the mode off and on, same traffic (same seed)."""
    kwargs = {"runs": runs, "max_tokens": max_tokens, "max_others": max_others, "kv_cache_dtype": kv_cache_dtype}
    if progress is not None:
        kwargs["progress"] = progress
    return {mode: divergence_experiment(model, tokenizer, prompt_ids, batch_invariant=mode, **kwargs)
            for mode in (False, True)}


def cached_divergence(path: Path = CACHED) -> dict:
    """What ``benchmarks/bench_determinism.py`` measured and kept (200 runs per KV format and mode, the mode's
    throughput cost), with the machine and versions it ran on."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run .venv/bin/python benchmarks/bench_determinism.py "
                                f"--out {path}")
    result = json.loads(path.read_text())
    if not result.get("divergence"):
        raise ValueError(f"{path} holds no divergence runs")
    return result


def cached_frame(result: dict) -> pd.DataFrame:
    return pd.DataFrame(result["divergence"])


def throughput_cost(model, tokenizer, prompts: list[list[int]], *, max_tokens: int = 16, repeats: int = 2,
                    progress=None) -> pd.DataFrame:
    kwargs = {"max_tokens": max_tokens, "repeats": repeats}
    if progress is not None:
        kwargs["progress"] = progress
    return mode_cost(model, tokenizer, prompts, **kwargs)


def chat_prompts(tokenizer) -> tuple[list[int], list[list[int]]]:
    """The prompt under study and the cost comparison's requests, through the chat template."""
    return encode_prompt(tokenizer, PROMPT), [encode_prompt(tokenizer, p) for p in COST_PROMPTS]


__all__ = ["CACHED", "PROMPT", "ProductCheck", "attention_paths", "cached_divergence", "cached_frame",
           "chat_prompts", "live_divergence", "product_check", "summary", "summation_orders", "throughput_cost"]
