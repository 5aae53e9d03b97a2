"""What both block managers share: one pool of blocks, a record per sequence, and the questions asked of them.

`workbench.cache.block_manager.BlockManager` keeps one block table per sequence; `workbench.cache.
hybrid_block_manager.HybridBlockManager` keeps one per KV group. Both draw from one `BlockPool` whose evictable
blocks wait in a prefix cache, both answer the scheduler, the bookkeeper and the batch builder with the same
methods, and both keep, per sequence, how many positions have slots (``num_reserved``), how many of those hold
computed KV (``num_computed``) and **their own copy of its tokens**. The copy is the manager's: it is taken at
``add_sequence``/``fork``, grows only through ``append_tokens`` (the engine's scheduler calls it for every token a
sequence gains) and shrinks only through ``truncate``, so the manager can never change a caller's list, and a
caller's list changing behind its back never changes which blocks it hashes.

The CPU side only: integers, never a tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from workbench.cache.block_pool import BlockPool
from workbench.cache.prefix_cache import PrefixCacheStats


class NoFreeBlocksError(RuntimeError):
    """Not enough free or evictable blocks for a reservation; nothing was changed."""


def check_count(name: str, value: int, upper: int | None = None) -> None:
    """ValueError unless ``value`` >= 0 (and <= ``upper`` when one is given)."""
    if upper is None and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    if upper is not None and not 0 <= value <= upper:
        raise ValueError(f"{name} must be in [0, {upper}], got {value}")


def check_sizes(**sizes: int) -> None:
    """ValueError naming the first of ``sizes`` that is not an integer >= 1."""
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


class SequenceRecord:
    """What a manager knows of one sequence besides its blocks."""

    __slots__ = ("tokens", "num_computed", "num_reserved")

    def __init__(self, tokens: list[int], num_computed: int, num_reserved: int):
        self.tokens = tokens  # the manager's own copy (see the module docstring)
        self.num_computed = num_computed  # positions [0, num_computed) hold this sequence's KV
        self.num_reserved = num_reserved  # positions [0, num_reserved) have slots


class BlockManagerBase:
    """The pool, the sequence records, and every question that reads them the same way in both managers."""

    __slots__ = ("num_blocks", "block_size", "_caching", "prefix_cache", "_pool", "_ref", "_seqs")

    def __init__(self, num_blocks: int, block_size: int, prefix_cache, enable_prefix_caching: bool):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._caching = bool(enable_prefix_caching)
        self._use_cache(prefix_cache)
        self._seqs: dict[int, SequenceRecord] = {}

    def _use_cache(self, prefix_cache) -> None:
        """A fresh pool whose evictable blocks wait in ``prefix_cache`` (either cache class: same interface)."""
        self.prefix_cache = prefix_cache
        self._pool = BlockPool(self.num_blocks, prefix_cache)
        self._ref = self._pool.ref  # read on every call; the pool owns and updates it

    # ---------------------------------------------------------------------------------------------- tokens
    def _new_tokens(self, seq_id: int, token_ids: Sequence[int]) -> list[int]:
        """The manager's copy of a new sequence's tokens, after checking the id is free and the list usable."""
        if seq_id in self._seqs:
            raise ValueError(f"seq_id {seq_id!r} is already added; free it before adding it again")
        if not isinstance(token_ids, list | tuple) or len(token_ids) == 0:
            raise ValueError(f"token_ids for seq_id {seq_id!r} must be a non-empty list, got {token_ids!r}")
        return list(token_ids)

    def _fork_tokens(self, parent_id: int, child_id: int, token_ids: Sequence[int] | None) -> list[int]:
        """The child's copy: ``token_ids`` (default: the parent's tokens), which must agree with the parent's
        wherever the parent has computed KV."""
        parent = self._get(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"child seq_id {child_id!r} is already added; choose an unused id")
        computed = parent.num_computed
        tokens = list(parent.tokens) if token_ids is None else token_ids
        if not isinstance(tokens, list | tuple) or list(tokens[:computed]) != parent.tokens[:computed]:
            raise ValueError(f"child seq_id {child_id!r} must be handed a token list that starts with the "
                             f"{computed} computed tokens of its parent {parent_id!r}")
        return list(tokens)

    def append_tokens(self, seq_id: int, token_ids: Sequence[int]) -> None:
        """Tokens the sequence gained (a sampled token, or a caller driving the manager by hand)."""
        self._get(seq_id).tokens.extend(token_ids)

    def _forget_past(self, seq: SequenceRecord, num_tokens: int) -> None:
        """``truncate``'s common part: the manager's tokens, computed KV and slots beyond ``num_tokens`` go."""
        check_count("num_tokens", num_tokens, max(len(seq.tokens), seq.num_reserved))
        del seq.tokens[num_tokens:]
        seq.num_computed = min(seq.num_computed, num_tokens)
        seq.num_reserved = min(seq.num_reserved, num_tokens)

    # ---------------------------------------------------------------------------------------------- queries
    @property
    def enable_prefix_caching(self) -> bool:
        """Fixed at construction (blocks cached earlier would otherwise linger): build a new manager to toggle."""
        return self._caching

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    def num_computed_tokens(self, seq_id: int) -> int:
        return self._get(seq_id).num_computed

    def num_reserved_tokens(self, seq_id: int) -> int:
        return self._get(seq_id).num_reserved

    def token_ids(self, seq_id: int) -> list[int]:
        return list(self._get(seq_id).tokens)

    def blocks_to_reserve(self, seq_id: int, num_tokens: int) -> int:
        raise NotImplementedError

    def can_reserve(self, seq_id: int, num_tokens: int) -> bool:
        return self.blocks_to_reserve(seq_id, num_tokens) <= self.num_free_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: never-cached free ones plus evictable cached ones."""
        return self._pool.num_free

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, in use or evictable."""
        return len(self.prefix_cache)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def evictable_blocks(self) -> list[int]:
        """Unreferenced cached blocks in eviction order (next victim first)."""
        return self.prefix_cache.evictable_blocks()

    @property
    def stats(self) -> PrefixCacheStats:
        """A snapshot of the prefix-cache counters."""
        return replace(self.prefix_cache.stats)

    def reset_stats(self) -> None:
        self.prefix_cache.stats = PrefixCacheStats()

    def clear_prefix_cache(self) -> None:
        """Drop every unreferenced cached block (they become plain free blocks); blocks in use stay cached."""
        self._pool.clear_cache()

    def _count_query(self, num_queried: int, num_hit: int) -> None:
        stats = self.prefix_cache.stats
        stats.queried_tokens += num_queried
        stats.hit_tokens += num_hit

    def _get(self, seq_id: int):
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise ValueError(f"unknown seq_id {seq_id!r} (never added, or already freed)")
        return seq
