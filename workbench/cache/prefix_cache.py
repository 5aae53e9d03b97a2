"""Prefix cache: remember which KV blocks hold which prompt prefix, so a prefix shared by many requests (a
system prompt, a few-shot preamble, an earlier turn of a chat) is prefilled once and then reused.

A cached block is a *full* block whose KV has been computed. What its KV depends on is not just its own
``block_size`` tokens but every token before it, so a block is keyed by a hash chained from its parent block's
hash and its own token ids. The hash only finds a candidate: on a hit the block's own tokens and its parent
block are compared too, so a hash collision is a miss, never the wrong KV. (With the parent compared by block
id, comparing tokens at every depth of the chain checks the whole prefix.)

Cached blocks whose last user has finished are not wiped. They wait in an LRU pool of *evictable* blocks: a
later request can still hit them (they then leave the pool), and the allocator evicts the least recently
released one when it runs out of never-cached blocks. The block manager releases a sequence's blocks last to
first, so the deepest block of a chain is always older in the pool than the prefix it extends and is evicted
first: a prefix never disappears while a block extending it is still cached.

This module keeps only the bookkeeping (hashes, parents, tokens, the pool, counters); reference counts and
block tables live in :mod:`workbench.cache.block_manager`. Nothing here touches tensors.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

HashFn = Callable[[int | None, tuple[int, ...]], int]

# The parent of a sequence's first block. Block ids are >= 0, so it can never be mistaken for one.
ROOT = -1


def default_block_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Python's tuple hash: fast, and deterministic for ints (``PYTHONHASHSEED`` only salts str and bytes).
    Collisions are possible but harmless: every hit is verified against the stored tokens and parent."""
    return hash((parent_hash, token_ids))


@dataclass(slots=True)
class PrefixCacheStats:
    """Counters since construction or the last ``reset_stats()``; the block manager hands out copies."""

    queried_tokens: int = 0  # every token of every sequence added (with caching off too, so hit_rate reads 0)
    hit_tokens: int = 0      # of those, the ones whose KV came from the cache
    evicted_blocks: int = 0  # cached blocks reclaimed by the allocator (clear_prefix_cache() is not counted)
    evicted_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        """hit_tokens / queried_tokens, 0.0 before any query."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


@dataclass(slots=True, frozen=True)
class CachedBlock:
    """What a registered block holds: the KV of ``token_ids`` following the prefix that ends in ``parent``."""

    block_hash: int
    parent: int  # block id of the cached block before it, or ROOT
    token_ids: tuple[int, ...]


class EvictablePool:
    """The LRU pool of unreferenced registered blocks and the cache's counters, the part both prefix caches share
    (this one and `workbench.cache.grouped_prefix_cache`); a subclass says how a block is unregistered."""

    __slots__ = ("block_size", "stats", "_evictable")

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.stats = PrefixCacheStats()
        # Insertion order is eviction order: the first key is the least recently released block.
        self._evictable: OrderedDict[int, None] = OrderedDict()

    # ------------------------------------------------------------------------------------ evictable pool
    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def evictable_blocks(self) -> list[int]:
        """Unreferenced cached blocks, next to be evicted first."""
        return list(self._evictable)

    def release(self, block: int) -> None:
        """A registered block lost its last user: it becomes the most recently used evictable block."""
        self._evictable[block] = None

    def reuse(self, block: int) -> None:
        """A hit on an evictable block takes it out of the pool (no-op for a block in use)."""
        self._evictable.pop(block, None)

    def evict(self) -> int:
        """Un-register the least recently released block and return its id for reuse."""
        block, _ = self._evictable.popitem(last=False)
        self._unregister(block)
        self.stats.evicted_blocks += 1
        self.stats.evicted_tokens += self.block_size
        return block

    def clear(self) -> list[int]:
        """Un-register every evictable block (blocks in use stay cached) and return their ids."""
        blocks = list(self._evictable)
        self._evictable.clear()
        for block in blocks:
            self._unregister(block)
        return blocks

    def __contains__(self, block: int) -> bool:
        raise NotImplementedError  # registered, in use or evictable

    def _unregister(self, block: int) -> None:
        raise NotImplementedError


class PrefixCache(EvictablePool):
    """Registered blocks by hash and by id, plus the LRU pool of the unreferenced ones."""

    __slots__ = ("hash_fn", "_by_hash", "_entries")

    def __init__(self, block_size: int, hash_fn: HashFn | None = None):
        super().__init__(block_size)
        self.hash_fn: HashFn = hash_fn or default_block_hash
        self._by_hash: dict[int, int] = {}
        self._entries: dict[int, CachedBlock] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block: int) -> bool:
        return block in self._entries

    def entry(self, block: int) -> CachedBlock | None:
        return self._entries.get(block)

    def items(self) -> list[tuple[int, CachedBlock]]:
        return list(self._entries.items())

    def block_for_hash(self, block_hash: int) -> int | None:
        return self._by_hash.get(block_hash)

    # ---------------------------------------------------------------------------------------------- lookup
    def match(self, parent: int, token_ids: tuple[int, ...]) -> tuple[int, int | None]:
        """The chained hash of a block holding ``token_ids`` after ``parent`` (ROOT or a registered block),
        and the cached block with exactly that content, or None (a miss, which includes a hash collision)."""
        parent_hash = None if parent == ROOT else self._entries[parent].block_hash
        block_hash = self.hash_fn(parent_hash, token_ids)
        block = self._by_hash.get(block_hash)
        if block is not None:
            found = self._entries[block]
            if found.parent != parent or found.token_ids != token_ids:
                block = None
        return block_hash, block

    def lookup(self, token_ids: Sequence[int], max_blocks: int) -> list[int]:
        """Cached blocks holding the longest prefix of ``token_ids``, at most ``max_blocks`` of them. Walks the
        chain block by block and stops at the first miss. Changes nothing: no counters, no LRU order."""
        blocks: list[int] = []
        parent, size = ROOT, self.block_size
        for start in range(0, max_blocks * size, size):
            _, block = self.match(parent, tuple(token_ids[start:start + size]))
            if block is None:
                break
            blocks.append(block)
            parent = block
        return blocks

    def register(self, block: int, parent: int, token_ids: tuple[int, ...], block_hash: int) -> bool:
        """Make ``block`` findable. False (and nothing registered) if another block already owns the hash:
        first come, first served, since replacing it could strand the blocks chained after it."""
        if block_hash in self._by_hash or block in self._entries:
            return False
        self._by_hash[block_hash] = block
        self._entries[block] = CachedBlock(block_hash, parent, token_ids)
        return True

    def _unregister(self, block: int) -> None:
        del self._by_hash[self._entries.pop(block).block_hash]
