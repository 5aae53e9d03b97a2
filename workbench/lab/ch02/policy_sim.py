"""LRU against LFU on the prefix cache: the same request stream replayed through a small block-level simulator.

The engine's prefix cache evicts the least recently released block (LRU, `workbench.cache.prefix_cache`), and
chapter 2's eviction sweep measures exactly that. To set LFU beside it without a second eviction policy in the
engine, this module replays the requests through a model of the same bookkeeping: requests run one at a time;
a request hits the longest cached chain of its full blocks (never the block holding its last token, which must
be computed to yield logits); it takes new blocks from never-used ones first, then evicts; its full blocks are
cached once computed; when it finishes, its blocks are released last to first. Only the choice of victim
differs between policies:

* ``LRU``: the evictable block released longest ago (as the engine does);
* ``LFU``: the evictable block used the fewest times (its first computation and every hit count), ties going
  to the one released longest ago. A parent block is used at least as often as any block chained after it, so
  LFU too evicts the deep end of a prefix first.

The simulator's LRU is checked against the engine's measured hits and evictions on the same stream (in the
notebook and in the tests), which is what makes its LFU column worth reading.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

POLICIES = ("LRU", "LFU")


@dataclass(slots=True)
class SimResult:
    queried_tokens: int = 0
    hit_tokens: int = 0
    requests_hit: int = 0
    evicted_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class PrefixCacheSim:
    """Blocks of a prefix cache, keyed by the whole token prefix they end (what the engine's chained hash
    identifies), with one eviction policy."""

    def __init__(self, num_blocks: int, block_size: int, policy: str):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks, self.block_size, self.policy = num_blocks, block_size, policy
        self.never_used = num_blocks
        self.evictable: OrderedDict[tuple[int, ...], None] = OrderedDict()  # first = released longest ago
        self.uses: dict[tuple[int, ...], int] = {}  # every cached block (in use or evictable) -> times used
        self.result = SimResult()

    def run(self, prompt: Sequence[int]) -> int:
        """Serve one request to completion; returns the tokens that came from the cache."""
        size = self.block_size
        keys = [tuple(prompt[:end]) for end in range(size, len(prompt) + 1, size)]  # its full blocks
        hits = 0
        while hits < (len(prompt) - 1) // size and keys[hits] in self.uses:
            self.evictable.pop(keys[hits], None)
            self.uses[keys[hits]] += 1
            hits += 1
        needed = -(-len(prompt) // size) - hits
        if needed > self.never_used + len(self.evictable):
            raise ValueError(f"a request of {len(prompt)} tokens needs {needed} more blocks than the cache of "
                             f"{self.num_blocks} can free")
        for _ in range(needed):
            if self.never_used:
                self.never_used -= 1
            else:
                self._evict()
        for key in keys[hits:]:
            self.uses[key] = 1
        partial = len(prompt) % size != 0
        self.never_used += partial  # the partly filled last block is not cached: it goes back as a plain block
        for key in reversed(keys):  # released last to first: the deepest block is the oldest in the pool
            self.evictable[key] = None
        self._count(len(prompt), hits * size)
        return hits * size

    def _evict(self) -> None:
        # For LFU, min() keeps the first of equals: the least recently released.
        victim = (next(iter(self.evictable)) if self.policy == "LRU"
                  else min(self.evictable, key=self.uses.__getitem__))
        del self.evictable[victim]
        del self.uses[victim]
        self.result.evicted_blocks += 1

    def _count(self, queried: int, hit: int) -> None:
        self.result.queried_tokens += queried
        self.result.hit_tokens += hit
        self.result.requests_hit += hit > 0


def simulate(prompts: Sequence[Sequence[int]], num_blocks: int, block_size: int, policy: str) -> SimResult:
    """Replay ``prompts`` one at a time through a fresh simulated cache of ``num_blocks`` blocks."""
    sim = PrefixCacheSim(num_blocks, block_size, policy)
    for prompt in prompts:
        sim.run(prompt)
    return sim.result


def policy_sweep(prompts: Sequence[Sequence[int]], budgets: Sequence[int], block_size: int) -> pd.DataFrame:
    """Hit rate, requests hit and evictions of each policy at each budget (blocks), one row per pair."""
    rows = []
    for budget in budgets:
        for policy in POLICIES:
            result = simulate(prompts, budget, block_size, policy)
            rows.append({"budget_blocks": budget, "policy": policy, "hit_rate": result.hit_rate,
                         "requests_hit": result.requests_hit, "evicted_blocks": result.evicted_blocks})
    return pd.DataFrame(rows)
