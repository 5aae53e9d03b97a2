"""Chapter 2's LRU simulator of the prefix cache, with a second tier under it: what hit rate a working set gets
with the device's blocks alone, and with a tier of host memory or disk beneath them.

The device tier is chapter 2's `workbench.lab.ch02.policy_sim.PrefixCacheSim` (LRU, requests one at a time, blocks
released deepest first). Under it, the second tier mirrors the engine's (`workbench.cache.tier`) in the order the
engine does things: at admission the prompt's blocks that follow its device hits are looked up in the tier and, if
there, restored (they become most recently used there and are pinned for the step); the blocks the admission then
allocates evict device blocks, and each evicted block the tier does not hold yet is written to it after the
admission (write-back), the tier evicting its own least recently used unpinned block when full. The simulator's
counts must equal the engine's on the same stream (`engine_check` in the chapter and the tests): that is what
makes its sweep over working-set sizes worth reading.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from workbench.lab.ch02.policy_sim import PrefixCacheSim


@dataclass(slots=True)
class TierSimResult:
    queried_tokens: int = 0
    device_hit_tokens: int = 0
    restored_tokens: int = 0
    spilled_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        """Prompt tokens that were not recomputed (device hits and restores), over all prompt tokens."""
        return (self.device_hit_tokens + self.restored_tokens) / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def device_hit_rate(self) -> float:
        return self.device_hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class TwoTierSim(PrefixCacheSim):
    """``num_blocks`` device blocks (LRU) over ``tier_blocks`` blocks of a second tier (LRU); 0: no tier."""

    def __init__(self, num_blocks: int, block_size: int, tier_blocks: int):
        super().__init__(num_blocks, block_size, "LRU")
        if tier_blocks < 0:
            raise ValueError(f"tier_blocks must be >= 0, got {tier_blocks}")
        self.tier_blocks = tier_blocks
        self.tier: OrderedDict[tuple[int, ...], None] = OrderedDict()  # first = least recently used
        self.tier_result = TierSimResult()
        self._spills: list[tuple[int, ...]] = []

    def run(self, prompt: Sequence[int]) -> int:
        """Serve one request to completion; returns the prompt tokens not recomputed (device hits and restores)."""
        size = self.block_size
        keys = [tuple(prompt[:end]) for end in range(size, len(prompt) + 1, size)]
        limit = (len(prompt) - 1) // size
        hits = 0
        while hits < limit and keys[hits] in self.uses:  # device hits leave the evictable pool first
            self.evictable.pop(keys[hits], None)
            self.uses[keys[hits]] += 1
            hits += 1
        restored = 0
        while hits + restored < limit and keys[hits + restored] in self.tier:
            self.tier.move_to_end(keys[hits + restored])  # looked up, and pinned for this admission
            restored += 1
        pinned = set(keys[hits:hits + restored])
        needed = -(-len(prompt) // size) - hits  # restored blocks need device blocks like computed ones
        if needed > self.never_used + len(self.evictable):
            raise ValueError(f"a request of {len(prompt)} tokens needs {needed} more blocks than the cache of "
                             f"{self.num_blocks} can free")
        self._spills = []
        for _ in range(needed):
            if self.never_used:
                self.never_used -= 1
            else:
                self._evict()
        for key in self._spills:  # written back after the admission's allocations, in eviction order
            self._store(key, pinned)
        for key in keys[hits:]:
            self.uses[key] = 1
        self.never_used += len(prompt) % size != 0
        for key in reversed(keys):
            self.evictable[key] = None
        self._count(len(prompt), (hits + restored) * size)
        r = self.tier_result
        r.queried_tokens += len(prompt)
        r.device_hit_tokens += hits * size
        r.restored_tokens += restored * size
        return (hits + restored) * size

    def _evict(self) -> None:
        victim = next(iter(self.evictable))
        super()._evict()
        if self.tier_blocks and victim not in self.tier:
            self._spills.append(victim)

    def _store(self, key: tuple[int, ...], pinned: set) -> None:
        if key in self.tier:
            self.tier.move_to_end(key)
            return
        if len(self.tier) >= self.tier_blocks:
            victim = next((k for k in self.tier if k not in pinned), None)
            if victim is None:
                return
            del self.tier[victim]
        self.tier[key] = None
        self.tier_result.spilled_blocks += 1


def simulate_tiers(prompts: Sequence[Sequence[int]], num_blocks: int, block_size: int,
                   tier_blocks: int) -> TierSimResult:
    sim = TwoTierSim(num_blocks, block_size, tier_blocks)
    for prompt in prompts:
        sim.run(prompt)
    return sim.tier_result


def working_set_sweep(prompts_for, sizes: Sequence[int], num_blocks: int, tier_blocks: int,
                      block_size: int) -> pd.DataFrame:
    """Hit rate with the device alone and with the tier, for each working-set size (``prompts_for(size)`` gives
    the request stream of that many sessions)."""
    rows = []
    for size in sizes:
        prompts = prompts_for(size)
        alone = simulate_tiers(prompts, num_blocks, block_size, 0)
        tiered = simulate_tiers(prompts, num_blocks, block_size, tier_blocks)
        rows.append({"sessions": size, "device only": alone.hit_rate, "device + tier": tiered.hit_rate,
                     "from the tier": tiered.restored_tokens / tiered.queried_tokens})
    return pd.DataFrame(rows)
