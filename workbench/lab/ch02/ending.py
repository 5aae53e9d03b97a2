"""Chapter 2's ending: 'Try this' exercises whose answers the package computes (with the engine's own block
manager where blocks are involved), and the closing table that sets each of the book's key takeaways beside
what the chapter measured and a verdict computed from the chapter's results.
"""

from __future__ import annotations

import torch

from workbench.cache.block_manager import BlockManager
from workbench.cache.sizing import blocks_for_tokens, kv_bytes
from workbench.lab.ch02.budget import SEED_RANGE, KVShare, deployment_budget
from workbench.lab.ch02.eviction import EvictionSweep, PolicyComparison, eviction_prompts
from workbench.lab.ch02.policy_sim import simulate
from workbench.lab.ch02.runs import WITH_CACHE, WITHOUT_CACHE, CacheComparison, PagedTrace, PrefixRun
from workbench.lab.kit.closing import ClosingTable, Takeaway, Verdict
from workbench.lab.kit.contention import Contention, busy_takeaway
from workbench.lab.kit.evidence import Evidence
from workbench.lab.kit.exercises import Exercise
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


def exercises() -> dict[str, Exercise]:
    """The chapter's 'Try this' exercises, keyed as the notebook's cells use them."""
    return {
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


def _cache_row(cache: CacheComparison, contention: Contention | None = None) -> Takeaway:
    steps = Evidence.bootstrap("decode step without / with the cache", cache.decode_steps_ms(WITHOUT_CACHE),
                               cache.decode_steps_ms(WITH_CACHE), n_label="decode steps")
    same = Evidence.exact("greedy tokens identical with and without the cache", float(cache.same_tokens), 0.5,
                          unit="")
    row = Takeaway.judged(
        "The KV cache stores keys and values, eliminating redundant computation during generation.",
        f"decode {cache.cached_tokens_per_s:.1f} vs {cache.recompute_tokens_per_s:.1f} tokens/s with and without "
        f"the cache ({cache.speedup:.1f}x); identical greedy tokens both ways: {cache.same_tokens}",
        [steps, same],
        wrong_note="not seen in this run: " + (
            "the greedy tokens differ between the modes" if not cache.same_tokens else
            "decoding was no faster with the cache (at this short a context the recompute is cheap)"))
    return busy_takeaway(row, contention)


def _size_row(share: KVShare) -> Takeaway:
    formula = 2 * 80 * 8 * 4096 * 128 * 2
    package = kv_bytes(model_spec("llama-3-70b"), 4096, kv_format=torch.float16)
    v = share.verdict
    return Takeaway.judged(
        "Cache size scales with layers x KV heads x head_dim x length x batch; often 10–30% of GPU memory.",
        f"the size formula gives the package's sizing for a 70B model (80 layers, 8 KV heads, 4,096 fp16 tokens): "
        f"{package == formula}; the share of GPU memory a serving engine leaves the cache runs from "
        f"{v['lowest']:.0%} to {v['highest']:.0%} across {v['fitting']} deployments, {v['inside']} of them inside "
        f"{SEED_RANGE[0]:.0%}–{SEED_RANGE[1]:.0%}",
        [Evidence.exact("|package sizing - formula| (bytes)", abs(package - formula), 0.5, expect="below", unit="B"),
         Evidence.exact("share of deployments inside 10–30%", share.inside_share, 0.5, n=int(v["fitting"]),
                        n_label=f"{v['fitting']} deployments", unit="%")],
        wrong_note=("the formula holds, but '10–30% of GPU memory' is not a rule: the cache gets whatever the "
                    "weights and activations leave, which depends on the model, the GPU and the tensor-parallel "
                    "degree" if package == formula else "the formula does not match the package's sizing"))


def _paged_row(paged: PagedTrace) -> Takeaway:
    totals = paged.totals(2048, 16)
    return Takeaway.judged(
        "PagedAttention allocates fixed blocks: near-zero waste and cross-request prefix sharing.",
        f"{len(paged.lengths)} mixed requests: paged blocks of 16 tokens waste {totals['paged_waste']:.1%} of what "
        f"they hold (partly filled last blocks), max_len-2,048 buffers waste {totals['contiguous_waste']:.1%}",
        Evidence.exact("contiguous waste - paged waste", totals["contiguous_waste"] - totals["paged_waste"], 0.0,
                       n=len(paged.lengths), n_label=f"{len(paged.lengths)} requests (block counts)", unit="pts"),
        caveat=totals["paged_waste"] >= 0.02,
        caveat_note="near zero against contiguous buffers, but each sequence's last block is partly empty: up to "
                    "block_size - 1 tokens per sequence, several percent for short requests",
        wrong_note="paged blocks wasted no less than contiguous buffers here")


def _prefix_row(history: list[PrefixRun], contentions: tuple[Contention | None, ...] = ()) -> Takeaway:
    claim = "Prefix caching cuts prefill for shared static prompts, for exact token matches only."
    runs = {(r.layout, r.caching): r for r in history}  # the latest run of each configuration
    hit, off, dynamic = (runs.get(k) for k in (("static first", True), ("static first", False),
                                               ("dynamic first", True)))
    if hit is None or off is None or dynamic is None:
        return Takeaway(claim, f"{len(history)} configuration(s) run; the comparison needs static first with "
                        "caching on and off, and dynamic first", Verdict.NOT_MEASURABLE,
                        note="run the three prefix-cache configurations of section 7 first",
                        evidence=(Evidence.absent("TTFT with and without the prefix cache"),))
    speedup = off.later_median_ms / hit.later_median_ms
    faster = Evidence.bootstrap("TTFT after the first request, caching off / on",
                                off.frame["ttft_ms"].iloc[1:], hit.frame["ttft_ms"].iloc[1:])
    exact_only = Evidence.exact("token hit rate with the per-request header first", dynamic.hit_rate,
                                hit.warm_hit_rate / 2, expect="below", n=len(dynamic.frame),
                                n_label=f"{len(dynamic.frame)} requests (token counts)", unit="%")
    row = Takeaway.judged(
        claim,
        f"median TTFT after the first request: {hit.later_median_ms:.0f} ms with hits vs {off.later_median_ms:.0f} "
        f"ms with caching off ({speedup:.1f}x); with the per-request header first the hit rate is "
        f"{dynamic.hit_rate:.0%}",
        [faster, exact_only],
        wrong_note="not seen in this run: " + (
            "requests with the header first still hit the cache" if dynamic.hit_rate else
            "hits were not clearly faster than the same requests with caching off"))
    return busy_takeaway(row, *contentions)


def _eviction_row(eviction: EvictionSweep, policies: PolicyComparison) -> Takeaway:
    gaps = {**eviction.policy_gaps, **policies.policy_gaps}
    by_budget = eviction.budget_spread
    by_policy = max(abs(g) for g in gaps.values())
    return Takeaway.judged(
        "Eviction policy affects effective cache use as much as raw cache size.",
        f"the cache budget moves the engine's hit rate by {100 * by_budget:.0f} points; LFU minus LRU, where they "
        "differ most: " + ", ".join(f"{100 * g:+.0f} points ({stream})" for stream, g in gaps.items()),
        Evidence.exact("largest policy gap / budget effect on the hit rate", by_policy / by_budget, 0.5,
                       n=len(gaps), n_label=f"{len(gaps)} streams (token counts)"),
        wrong_note="between LRU and LFU on these seeded streams, whether the working set fits matters far more "
                   "than the policy: size the cache first (a policy that pins a fixed set of prefixes, not tested "
                   "here, can still beat both on a stream that cycles through more prefixes than fit)")


def closing_table(cache: CacheComparison, share: KVShare, paged: PagedTrace, prefix_history: list[PrefixRun],
                  eviction: EvictionSweep, policies: PolicyComparison, *, cache_contention: Contention | None = None,
                  prefix_contentions: tuple[Contention | None, ...] = ()) -> ClosingTable:
    """The book's chapter-2 takeaways, what this chapter measured for each, and a computed verdict.

    ``cache_contention``: the with/without-cache panel's reading (``panel.contention``); ``prefix_contentions``:
    the prefix panel's readings of the runs its row compares (hits, and caching off). A row judged from a timing
    says "the machine was busy" instead of concluding when one of its readings was busy; rows judged from counts
    (sizes, blocks, hit rates) do not depend on them."""
    return ClosingTable([_cache_row(cache, cache_contention), _size_row(share), _paged_row(paged),
                         _prefix_row(prefix_history, prefix_contentions), _eviction_row(eviction, policies)])
