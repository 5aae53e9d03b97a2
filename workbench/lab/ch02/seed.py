"""Chapter 2's seed claims recomputed (`workbench.lab.kit.seed_claims`; the list is datasets/seed_claims/ch02.csv)."""

from __future__ import annotations

import pandas as pd
import torch

from workbench.cache.sizing import blocks_for_tokens, kv_bytes
from workbench.config import CacheConfig
from workbench.lab.kit import seed_claims as kit
from workbench.lab.kit.feasibility import check
from workbench.models import model_spec

GiB = 2**30


def _recompute_cost() -> str:
    without = sum(range(2000, 2500))
    return (f"without a cache the 500 steps project K and V for {without:,} token positions (2,000 + 2,001 + … + "
            f"2,499), with one 2,500: {without / 2500:.0f}x the projection work; the attention itself reads every "
            "earlier token in both cases")


def _llama3_8b() -> str:
    b = kv_bytes(model_spec("llama-3-8b"), 4096, kv_format=torch.float16)
    return f"{b:,} bytes = {b / 2**20:.0f} MiB = {b / 1e9:.3f} GB (holds; its 'MB' is MiB)"


def _llama3_70b() -> str:
    b = kv_bytes(model_spec("llama-3-70b"), 4096, kv_format=torch.float16)
    return f"{b:,} bytes = {b / GiB:.2f} GiB = {b / 1e9:.2f} GB (holds; its 'GB' is GiB)"


def _batch8() -> str:
    b = 8 * kv_bytes(model_spec("llama-3-70b"), 4096, kv_format=torch.float16)
    return f"8 x 1.25 GiB = {b / GiB:.0f} GiB (holds)"


def _a100_70b() -> str:
    one = check("llama-3-70b", "A100 80GB", batch=8, context=4096, dtype=torch.float16)
    return (f"the 70B model's fp16 weights alone are {one.weight_bytes_per_gpu / GiB:.0f} GiB: on one 80 GB A100 "
            f"it {one.label.split(': ', 1)[1]}; the cache is 'not catastrophic' only on a deployment that exists")


def _mha64() -> str:
    spec = model_spec("llama-3-70b")
    per = kv_bytes(spec.replace(num_kv_heads=64), 4096, kv_format=torch.float16)
    return (f"64 KV heads: {per / GiB:.0f} GiB per sequence, 8 of them {8 * per / GiB:.0f} GiB (holds: the whole "
            "80 GiB, before 131 GiB of weights)")


def _block_size() -> str:
    return f"the engine's default block is {CacheConfig().block_size} tokens, as vLLM's (holds)"


def _paged_800() -> str:
    return (f"800 tokens = {blocks_for_tokens(800, 16)} blocks of 16, no slot empty (holds for a multiple of 16); "
            f"801 tokens take {blocks_for_tokens(801, 16)} blocks with 15 slots empty: up to block_size - 1 per "
            "sequence")


def _contiguous_800() -> str:
    return (f"4,096 - 800 = {4096 - 800:,} slots wasted with a 4K = 4,096-token buffer (3,200 with 4,000); "
            f"{(4096 - 800) / 4096:.0%} of the buffer")


def _prefix_10k() -> str:
    return (f"10,000 x 2,000 = {10_000 * 2000 / 1e6:.0f} M prompt tokens a day computed without the cache, 2,000 "
            "with a cache that never evicts: the computed tokens do go to almost zero; the time does not "
            "(section 7 measures a hit's TTFT)")


CHECKS = {"recompute_cost": _recompute_cost, "llama3_8b": _llama3_8b, "llama3_70b": _llama3_70b,
          "batch8": _batch8, "a100_70b": _a100_70b, "mha64": _mha64, "block_size": _block_size,
          "paged_800": _paged_800, "contiguous_800": _contiguous_800, "prefix_10k": _prefix_10k}


def seed_claims() -> pd.DataFrame:
    """Every number and rule of the book's chapter 2, with what this chapter finds for it."""
    return kit.table("ch02", CHECKS)
