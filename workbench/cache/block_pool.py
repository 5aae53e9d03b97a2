"""The physical KV blocks: who references each one, and where an unreferenced block waits to be reused.

Every block is in exactly one of three states: *in use* (reference count > 0: some block table maps it),
*free* (unreferenced and holding nothing anyone can look up), or *evictable* (unreferenced but registered in the
prefix cache, so a later request may still hit it). Allocation prefers free blocks, because taking an evictable
one throws cached KV away; only when none are left does it evict the least recently released evictable block.
Split from :mod:`workbench.cache.block_manager`, which decides *which* blocks a sequence maps.
"""

from __future__ import annotations

from collections import deque

from workbench.cache.prefix_cache import EvictablePool


class BlockPool:
    """Reference counts plus the free list; the evictable pool itself belongs to the prefix cache."""

    __slots__ = ("num_blocks", "cache", "ref", "free")

    def __init__(self, num_blocks: int, cache: EvictablePool):
        self.num_blocks = num_blocks
        self.cache = cache
        self.ref = [0] * num_blocks
        # FIFO, so a fresh manager hands out blocks 0, 1, 2, ... (easy to follow in the notebooks).
        self.free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take: free ones plus evictable cached ones."""
        return len(self.free) + self.cache.num_evictable

    def allocate(self) -> int:
        """A block with reference count 1. The caller has checked ``num_free``."""
        block = self.free.popleft() if self.free else self.cache.evict()
        self.ref[block] = 1
        return block

    def acquire(self, block: int) -> None:
        """One more table maps an existing block (a cache hit or a fork)."""
        if self.ref[block] == 0:
            self.cache.reuse(block)
        self.ref[block] += 1

    def release(self, block: int) -> None:
        """One table fewer maps the block; unreferenced, it becomes evictable if cached, else free."""
        self.ref[block] -= 1
        if self.ref[block] == 0:
            if block in self.cache:
                self.cache.release(block)
            else:
                self.free.append(block)

    def clear_cache(self) -> None:
        """Turn every evictable block into a free one."""
        self.free.extend(self.cache.clear())
