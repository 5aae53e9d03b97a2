"""Consistency checks for the block manager, kept apart from it because they are slow on purpose.

:func:`check_block_manager` recomputes from scratch everything
the manager maintains incrementally (reference counts, the free/evictable/used partition, the prefix-cache
index) and the properties that make sharing safe: a cached block's stored tokens equal the tokens of every
sequence that maps it, tables sharing a block agree on every block before it (so all users of a cached block
hold the prefix it extends), and the eviction order never puts a prefix before a block extending it.
:func:`check_sequences` checks what the engine's scheduler keeps in step with the manager: the sequences it runs
are the ones the manager knows, with the same tokens and computed counts, and the waiting ones hold nothing.
Property tests call them after every step; the engine never does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from workbench.cache.block_manager import BlockManager, _SeqState
from workbench.cache.prefix_cache import ROOT
from workbench.intmath import ceil_div


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def check_block_manager(bm: BlockManager) -> None:
    """Raise AssertionError naming the first broken invariant of ``bm``."""
    _check_partition(bm)
    _check_cache_index(bm)
    holders: dict[int, tuple[int, int, int]] = {}  # block -> (seq_id, index, block before it) of a first holder
    counts: Counter[int] = Counter()
    for seq_id, seq in bm._seqs.items():
        _check_sequence(bm, seq_id, seq)
        for index, block in enumerate(seq.table):
            counts[block] += 1
            before = seq.table[index - 1] if index else ROOT
            first = holders.setdefault(block, (seq_id, index, before))
            _require(first[1:] == (index, before),
                     f"block {block} is shared by seq {first[0]} (index {first[1]}, after block {first[2]}) and "
                     f"seq {seq_id} (index {index}, after block {before}): shared blocks need identical prefixes")
    for block in range(bm.num_blocks):
        _require(bm._pool.ref[block] == counts[block],
                 f"block {block} has ref count {bm._pool.ref[block]} but {counts[block]} table entries")
    _check_eviction_order(bm)


def check_sequences(bm, running: Iterable, waiting: Iterable) -> None:
    """Raise AssertionError unless the scheduler's sequences (anything with ``seq_id``, ``token_ids`` and
    ``num_computed_tokens``) and the block manager ``bm`` (either kind) agree."""
    running = list(running)
    known = {seq_id for seq_id in bm._seqs}
    _require(known == {s.seq_id for s in running},
             f"the block manager knows seqs {sorted(known)} but {sorted(s.seq_id for s in running)} are running")
    for seq in running:
        _require(bm.token_ids(seq.seq_id) == list(seq.token_ids),
                 f"seq {seq.seq_id}: the block manager's tokens {bm.token_ids(seq.seq_id)} differ from the "
                 f"sequence's {seq.token_ids}")
        _require(bm.num_computed_tokens(seq.seq_id) == seq.num_computed_tokens,
                 f"seq {seq.seq_id}: {seq.num_computed_tokens} computed tokens on the sequence, "
                 f"{bm.num_computed_tokens(seq.seq_id)} in the block manager")
    for seq in waiting:
        _require(seq.num_computed_tokens == 0, f"waiting seq {seq.seq_id} counts {seq.num_computed_tokens} "
                 "computed tokens")


def _check_partition(bm: BlockManager) -> None:
    free = list(bm._pool.free)
    _require(len(free) == len(set(free)), f"a block is on the free list twice: {sorted(free)}")
    cache = bm.prefix_cache
    for block in free:
        _require(bm._pool.ref[block] == 0, f"free block {block} has ref count {bm._pool.ref[block]}")
        _require(block not in cache, f"free block {block} is still registered in the prefix cache")
    for block in cache.evictable_blocks():
        _require(bm._pool.ref[block] == 0, f"evictable block {block} has ref count {bm._pool.ref[block]}")
        _require(block in cache, f"evictable block {block} is not registered in the prefix cache")
    used = sum(1 for ref in bm._pool.ref if ref > 0)
    _require(all(ref >= 0 for ref in bm._pool.ref), "a ref count is negative")
    _require(len(free) + cache.num_evictable + used == bm.num_blocks,
             f"{len(free)} free + {cache.num_evictable} evictable + {used} used != {bm.num_blocks} blocks: a block "
             "leaked or is counted twice")


def _check_cache_index(bm: BlockManager) -> None:
    cache = bm.prefix_cache
    _require(bm.enable_prefix_caching or len(cache) == 0, "prefix caching is off but blocks are registered")
    for block, entry in cache.items():
        _require(cache.block_for_hash(entry.block_hash) == block,
                 f"block {block} is registered under hash {entry.block_hash} but that hash maps elsewhere")
        _require(len(entry.token_ids) == bm.block_size, f"cached block {block} is not full: {entry.token_ids}")
        _require(entry.parent == ROOT or entry.parent in cache,
                 f"cached block {block} extends block {entry.parent}, which is no longer cached")


def _check_sequence(bm: BlockManager, seq_id: int, seq: _SeqState) -> None:
    size, cache = bm.block_size, bm.prefix_cache
    _require(0 <= seq.num_computed <= min(len(seq.tokens), seq.num_reserved),
             f"seq {seq_id}: computed {seq.num_computed} exceeds tokens {len(seq.tokens)} or reserved "
             f"{seq.num_reserved}")
    _require(len(seq.table) == ceil_div(seq.num_reserved, size),
             f"seq {seq_id}: {len(seq.table)} blocks for {seq.num_reserved} reserved tokens")
    _require(len(seq.table) == len(set(seq.table)), f"seq {seq_id} maps a block twice: {seq.table}")
    _require(seq.num_registered <= seq.num_computed // size,
             f"seq {seq_id}: {seq.num_registered} registered blocks but {seq.num_computed} computed tokens")
    for index, block in enumerate(seq.table):
        entry = cache.entry(block)
        if entry is None:
            _require(index >= seq.num_registered, f"seq {seq_id}: block {block} at {index} should be cached")
            continue
        _require(entry.parent == (seq.table[index - 1] if index else ROOT),
                 f"seq {seq_id}: cached block {block} at index {index} extends block {entry.parent}, not the "
                 "block before it in the table")
        start = index * size
        known = seq.tokens[start:min(seq.num_computed, start + size)]
        _require(list(entry.token_ids[:len(known)]) == known,
                 f"seq {seq_id}: cached block {block} holds tokens {entry.token_ids} but the sequence has {known}")


def _check_eviction_order(bm: BlockManager) -> None:
    cache = bm.prefix_cache
    order = {block: rank for rank, block in enumerate(cache.evictable_blocks())}
    for block, rank in order.items():
        parent = cache.entry(block).parent
        _require(parent not in order or order[parent] > rank,
                 f"evictable block {parent} would be evicted before block {block}, which extends it")
