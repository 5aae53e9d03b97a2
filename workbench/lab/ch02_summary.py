"""Chapter 2's ending: 'Try this' exercises whose answers the package computes (with the engine's own block
manager where blocks are involved), and the closing table that sets each of the course's key takeaways beside
what the chapter measured and a verdict computed from the chapter's panels.
"""

from __future__ import annotations

import pandas as pd
import torch

from workbench.cache.block_manager import BlockManager
from workbench.cache.memory_compare import compare_reservations
from workbench.cache.sizing import blocks_for_tokens, kv_bytes
from workbench.lab.ch02_budget import SEED_RANGE, deployment_budget, share_verdict
from workbench.lab.ch02_policy_sim import simulate
from workbench.lab.kit.exercises import Exercise
from workbench.lab.kv_runs import eviction_prompts
from workbench.models import model_spec


def shared_prefix_hit(shared: int, block_size: int = 16) -> int:
    """Tokens of a second prompt served from the prefix cache when it shares its first ``shared`` tokens with
    a first prompt that ran before it (both 20 tokens longer than the shared part)."""
    blocks = BlockManager(64, block_size)
    first = list(range(1000, 1000 + shared + 20))
    blocks.add_sequence(0, first)
    blocks.reserve(0, len(first))
    blocks.mark_computed(0, len(first))
    blocks.free(0)
    return blocks.add_sequence(1, first[:shared] + list(range(5000, 5020)))


def blocks_after_fork(prompt_tokens: int, n: int, block_size: int = 16) -> int:
    """Distinct blocks ``n`` samples hold once each has written its first generated token after the prompt."""
    blocks = BlockManager(64, block_size, enable_prefix_caching=False)
    blocks.add_sequence(0, list(range(100, 100 + prompt_tokens)))
    blocks.reserve(0, prompt_tokens)
    blocks.mark_computed(0, prompt_tokens)
    for child in range(1, n):
        blocks.fork(0, child)
    for seq in range(n):  # each writes one token: copy-on-write wherever its last block is still shared
        blocks.append_tokens(seq, [7])
        blocks.reserve(seq, prompt_tokens + 1)
        blocks.mark_computed(seq, prompt_tokens + 1)
    return blocks.num_used_blocks


def better_policy(pattern: str, num_prefixes: int, budget: int, num_requests: int = 200) -> str:
    """'LRU', 'LFU' or 'same': which eviction policy gets more token hits on the simulated stream."""
    prompts = eviction_prompts(num_prefixes, num_requests, pattern)
    lru, lfu = (simulate(prompts, budget, 16, p).hit_rate for p in ("LRU", "LFU"))
    return "same" if lru == lfu else ("LRU" if lru > lfu else "LFU")


EXERCISES: dict[str, Exercise] = {
    "blocks": Exercise(
        "A 1,000-token sequence in a paged cache with 16-token blocks: how many blocks does it hold?",
        lambda: blocks_for_tokens(1000, 16), rel_tol=0.0,
        why="62 full blocks hold 992 tokens; the last 8 need a 63rd block, half empty: the only waste paging has.",
        hint="round up."),
    "prefix_hit": Exercise(
        "Two prompts share their first 100 tokens, then differ. With 16-token blocks and prefix caching, how "
        "many tokens of the second prompt come from the cache?",
        lambda: shared_prefix_hit(100), rel_tol=0.0,
        why="only whole blocks are cached and shared: 6 blocks = 96 tokens; the block holding tokens 96-111 "
            "mixes shared and different tokens, so it is computed again.",
        hint="which blocks are entirely made of shared tokens?"),
    "fork_blocks": Exercise(
        "n = 4 samples of a 40-token prompt, 16-token blocks: how many distinct blocks do they hold once each has "
        "written its first generated token?",
        lambda: blocks_after_fork(40, 4), rel_tol=0.0,
        why="the 2 full prompt blocks stay shared by all four; the partly filled third block is copied on write "
            "for 3 of them (the last writer keeps the original): 2 + 4 = 6, against 12 without sharing.",
        hint="which block does the first generated token land in?"),
    "capacity": Exercise(
        "Llama-3-8B with a bf16 KV cache on one 80 GiB GPU (90% usable, activations of 8,192-token steps): how "
        "many 8,192-token sequences fit in the cache at once?",
        lambda: deployment_budget("llama-3-8b", 80 * 2**30).max_concurrency(8192), rel_tol=0.0,
        why="72 GiB usable - 15 GiB of weights - 1.4 GiB of activations leaves 55.7 GiB; a sequence takes "
            "8,192 x 131,072 B = 1 GiB.",
        hint="block_budget(...) in workbench.cache.sizing, then max_concurrency."),
    "policy": Exercise(
        "200 requests over 8 shared prefixes of 64 tokens whose hot set changes halfway (pattern 'shifting hot "
        "set'), cache of 16 blocks (half the working set): which eviction policy gets more hits, LRU or LFU?",
        lambda: better_policy("shifting hot set", 8, 16),
        why="LFU keeps the prefixes that were popular in the first half: their counts outlive their popularity, "
            "while LRU forgets them as soon as they go cold.",
        hint="what happens to a block's use count after it stops being used?"),
}


def _cache_row(cache_result) -> dict[str, str]:
    s = cache_result.summary
    fast, slow = s["decode_tokens_per_s"]
    return {"measured here": f"decode {fast:.1f} vs {slow:.1f} tokens/s with and without the cache "
                             f"({fast / slow:.1f}x); identical greedy tokens: {cache_result.same_tokens}",
            "verdict": "holds" if cache_result.same_tokens and fast > slow else "not seen here"}


def _size_row(share_table: pd.DataFrame) -> dict[str, str]:
    formula = 2 * 80 * 8 * 4096 * 128 * 2
    exact = kv_bytes(model_spec("llama-3-70b"), 4096, kv_format=torch.float16) == formula
    v = share_verdict(share_table)
    measured = (f"the size formula matches the package's sizing: {exact}; share of GPU memory left to KV: "
                f"{v['lowest']:.0%} to {v['highest']:.0%} across {v['fitting']} deployments, {v['inside']} inside "
                f"{SEED_RANGE[0]:.0%}–{SEED_RANGE[1]:.0%}")
    in_range = v["inside"] / max(v["fitting"], 1)
    verdict = ("holds" if exact and in_range > 0.8 else
               "formula holds; '10–30% of GPU memory' is wrong as a rule (the cache gets what weights leave)")
    return {"measured here": measured, "verdict": verdict}


def _paged_row(paged_lengths: list[tuple[int, int]], bytes_per_token: int) -> dict[str, str]:
    totals = compare_reservations(paged_lengths, bytes_per_token=bytes_per_token, max_len=2048,
                                  block_size=16).attrs["totals"]
    measured = (f"{len(paged_lengths)} mixed requests: paged blocks of 16 waste {totals['paged_waste']:.1%} "
                f"(partly filled last blocks), max_len-2,048 buffers {totals['contiguous_waste']:.1%}")
    verdict = ("holds" if totals["paged_waste"] < 0.02 else
               "holds with a caveat: near-zero against contiguous buffers, but each sequence's last block is "
               "partly empty")
    return {"measured here": measured, "verdict": verdict}


def _prefix_row(prefix_history: list[dict]) -> dict[str, str]:
    runs = {(h["layout"], h["caching"]): h for h in prefix_history}  # the latest run of each configuration
    hit, off, dynamic = (runs.get(k) for k in (("static first", True), ("static first", False),
                                               ("dynamic first", True)))
    if hit is None or off is None or dynamic is None:
        return {"measured here": "run the three prefix-cache configurations of section 5 first",
                "verdict": "not measured"}
    speedup = off["later_median_ms"] / hit["later_median_ms"]
    measured = (f"median TTFT after the first request: {hit['later_median_ms']:.0f} ms with hits vs "
                f"{off['later_median_ms']:.0f} ms with caching off ({speedup:.1f}x); dynamic part first: hit rate "
                f"{dynamic['hit_rate']:.0%}")
    verdict = "holds" if speedup > 1.5 and dynamic["hit_rate"] == 0 else "not seen here"
    return {"measured here": measured, "verdict": verdict}


def _eviction_row(engine_frame: pd.DataFrame, policy_gaps: dict[str, float]) -> dict[str, str]:
    by_budget = float(engine_frame["hit_rate"].max() - engine_frame["hit_rate"].min())
    by_policy = max(abs(g) for g in policy_gaps.values())
    measured = (f"the cache budget moves the engine's hit rate by {100 * by_budget:.0f} points; LFU minus LRU, where "
                "they differ most: " + ", ".join(f"{100 * g:+.0f} ({stream})" for stream, g in policy_gaps.items()))
    verdict = ("holds" if by_policy >= 0.5 * by_budget else
               "overstated here: whether the working set fits matters far more than the policy")
    return {"measured here": measured, "verdict": verdict}


SEED_TAKEAWAYS = (
    "The KV cache stores keys and values, eliminating redundant computation during generation.",
    "Cache size scales with layers x KV heads x head_dim x length x batch; often 10–30% of GPU memory.",
    "PagedAttention allocates fixed blocks: near-zero waste and cross-request prefix sharing.",
    "Prefix caching cuts prefill for shared static prompts, for exact token matches only.",
    "Eviction policy affects effective cache use as much as raw cache size.",
)


def takeaways(cache_result, share_table: pd.DataFrame, paged_lengths: list[tuple[int, int]],
              bytes_per_token: int, prefix_history: list[dict], engine_eviction: pd.DataFrame,
              policy_gaps: dict[str, float]) -> pd.DataFrame:
    """The course's chapter-2 takeaways, what this chapter measured for each, and a verdict."""
    rows = [_cache_row(cache_result), _size_row(share_table), _paged_row(paged_lengths, bytes_per_token),
            _prefix_row(prefix_history), _eviction_row(engine_eviction, policy_gaps)]
    frame = pd.DataFrame(rows)
    frame.insert(0, "the seed says", SEED_TAKEAWAYS)
    frame.index = range(1, len(frame) + 1)
    return frame
