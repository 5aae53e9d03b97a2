"""Prefix caching in the block manager: hits, verification against hash collisions, LRU eviction (leaves
first), counters, the on/off switch, and a property test of hit lengths against a plain reference model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.cache.block_invariants import check_block_manager
from workbench.cache.block_manager import BlockManager
from workbench.cache.prefix_cache import ROOT, PrefixCache, default_block_hash


def computed_seq(bm: BlockManager, seq_id: int, tokens: list[int]) -> int:
    """Add a sequence and compute all of its tokens, as a prefill would; returns the hits."""
    hits = bm.add_sequence(seq_id, tokens)
    bm.reserve(seq_id, len(tokens))
    bm.mark_computed(seq_id, len(tokens))
    return hits


def test_default_hash_is_deterministic_and_chained():
    assert default_block_hash(None, (1, 2)) == default_block_hash(None, (1, 2))
    assert default_block_hash(None, (1, 2)) != default_block_hash(default_block_hash(None, (1, 2)), (1, 2))


# ----------------------------------------------------------------------------------------------------- hits
def test_hit_at_a_block_boundary():
    bm = BlockManager(16, 4)
    computed_seq(bm, 1, list(range(12)))
    assert bm.num_cached_blocks == 3
    assert bm.add_sequence(2, list(range(8)) + [99, 98]) == 8
    assert bm.block_table(2) == bm.block_table(1)[:2]
    assert [bm.ref_count(b) for b in bm.block_table(1)] == [2, 2, 1]
    assert bm.num_computed_tokens(2) == 8 and bm.num_reserved_tokens(2) == 8
    check_block_manager(bm)


def test_hit_stops_at_the_last_full_matching_block():
    bm = BlockManager(16, 4)
    computed_seq(bm, 1, list(range(12)))
    assert bm.add_sequence(2, list(range(6)) + [99] * 6) == 4   # diverges mid-block 1: only block 0 hits
    assert bm.add_sequence(3, [99] + list(range(1, 12))) == 0   # diverges in block 0


def test_fully_cached_prompt_still_computes_its_last_block():
    bm = BlockManager(8, 4)
    computed_seq(bm, 1, list(range(8)))
    assert bm.add_sequence(2, list(range(8))) == 4              # len - block_size, not 8
    assert bm.blocks_to_reserve(2, 8) == 1
    bm.reserve(2, 8)
    assert bm.block_table(2)[1] != bm.block_table(1)[1]
    bm.mark_computed(2, 8)
    # Its recomputed copy of block 1 duplicates a cached block: it switches to the cached one and frees its own.
    assert bm.block_table(2) == bm.block_table(1) and bm.num_used_blocks == 2
    check_block_manager(bm)


def test_a_prompt_within_one_block_never_hits():
    bm = BlockManager(8, 4)
    computed_seq(bm, 1, [1, 2, 3, 4])
    assert bm.add_sequence(2, [1, 2, 3, 4]) == 0
    assert bm.add_sequence(3, [1]) == 0


def test_only_computed_full_blocks_are_cached():
    bm = BlockManager(8, 4)
    bm.add_sequence(1, list(range(10)))
    bm.reserve(1, 10)
    bm.mark_computed(1, 7)                                      # block 1 is reserved but only partly computed
    assert bm.num_cached_blocks == 1
    assert bm.add_sequence(2, list(range(10))) == 4
    bm.mark_computed(1, 10)
    assert bm.num_cached_blocks == 2


def test_freed_blocks_stay_cached_and_a_hit_takes_them_back():
    bm = BlockManager(8, 2)
    computed_seq(bm, 1, [1, 2, 3, 4, 5])
    table = bm.block_table(1)
    bm.free(1)
    assert bm.num_free_blocks == 8 and bm.num_cached_blocks == 2
    assert bm.evictable_blocks() == [table[1], table[0]]        # deepest first
    assert bm.add_sequence(2, [1, 2, 3, 4, 9]) == 4
    assert bm.block_table(2) == table[:2] and bm.evictable_blocks() == []
    assert bm.num_free_blocks == 6 and bm.num_used_blocks == 2


def test_truncate_keeps_shared_cached_blocks():
    bm = BlockManager(16, 4)
    computed_seq(bm, 1, list(range(9)))
    assert bm.add_sequence(2, list(range(8)) + [7]) == 8
    bm.truncate(1, 2)                                           # seq 1 rolls back into block 0
    assert bm.num_cached_blocks == 2 and bm.block_table(2) == [0, 1] and bm.ref_count(1) == 1
    assert bm.add_sequence(3, list(range(9))) == 8
    check_block_manager(bm)


# ---------------------------------------------------------------------------------------------- eviction
def test_eviction_takes_never_cached_blocks_first_then_lru_leaves_first():
    bm = BlockManager(6, 2)
    computed_seq(bm, 1, [1, 2, 3, 4, 5, 6, 0])                 # blocks 0, 1, 2 cached; 3 holds the tail
    bm.free(1)
    assert bm.evictable_blocks() == [2, 1, 0]                   # the leaf goes first
    computed_seq(bm, 2, [7, 8, 9, 10, 0])                       # uses never-cached 4, 5, 3: nothing evicted
    assert bm.block_table(2) == [4, 5, 3] and bm.stats.evicted_blocks == 0
    bm.free(2)
    assert bm.evictable_blocks() == [2, 1, 0, 5, 4]

    bm.add_sequence(3, [11] * 4)
    bm.reserve(3, 4)                                            # free block 3, then evicts the LRU leaf 2
    assert bm.block_table(3) == [3, 2] and bm.evictable_blocks() == [1, 0, 5, 4]
    assert bm.stats.evicted_blocks == 1 and bm.stats.evicted_tokens == 2
    assert bm.add_sequence(4, [1, 2, 3, 4, 5, 6, 0]) == 4      # the rest of seq 1's prefix still hits
    check_block_manager(bm)


def test_a_hit_refreshes_lru_position():
    bm = BlockManager(8, 2)
    computed_seq(bm, 1, [1, 2, 3, 4, 5])                        # cached 0, 1
    bm.free(1)
    computed_seq(bm, 2, [7, 8, 9, 10, 0])                       # cached 3, 4
    bm.free(2)
    assert bm.evictable_blocks() == [1, 0, 4, 3]
    computed_seq(bm, 3, [1, 2, 6])                              # hits block 0
    bm.free(3)
    assert bm.evictable_blocks() == [1, 4, 3, 0]
    check_block_manager(bm)


def test_clear_prefix_cache_drops_only_unreferenced_blocks():
    bm = BlockManager(8, 2)
    computed_seq(bm, 1, [1, 2, 3, 4, 5])
    computed_seq(bm, 2, [7, 8, 9])
    bm.free(1)
    bm.clear_prefix_cache()
    assert bm.num_cached_blocks == 1 and bm.evictable_blocks() == [] and bm.num_free_blocks == 6
    assert bm.add_sequence(3, [1, 2, 3, 4, 5]) == 0
    assert bm.add_sequence(4, [7, 8, 0]) == 2
    assert bm.stats.evicted_blocks == 0
    check_block_manager(bm)


# ---------------------------------------------------------------------------------------------- counters
def test_counters_and_hit_rate():
    bm = BlockManager(8, 4)
    assert bm.stats.hit_rate == 0.0
    computed_seq(bm, 1, list(range(10)))
    computed_seq(bm, 2, list(range(9)) + [50])
    stats = bm.stats
    assert (stats.queried_tokens, stats.hit_tokens) == (20, 8)
    assert stats.hit_rate == pytest.approx(0.4)
    bm.reset_stats()
    assert stats.queried_tokens == 20                           # stats hands out snapshots
    assert bm.stats.queried_tokens == 0 and bm.stats.hit_tokens == 0


# -------------------------------------------------------------------------------------------- on / off
def test_prefix_caching_off():
    bm = BlockManager(8, 2, enable_prefix_caching=False)
    computed_seq(bm, 1, [1, 2, 3, 4, 5])
    assert bm.num_cached_blocks == 0
    assert computed_seq(bm, 2, [1, 2, 3, 4, 5]) == 0
    bm.free(1)
    assert bm.evictable_blocks() == [] and bm.num_free_blocks == 5
    assert bm.blocks_needed([1, 2, 3, 4, 5]) == 3
    assert bm.stats.queried_tokens == 10 and bm.stats.hit_tokens == 0 and bm.stats.hit_rate == 0.0
    check_block_manager(bm)


# ------------------------------------------------------------------------------------------- collisions
def test_a_hash_where_everything_collides_never_returns_wrong_blocks():
    bm = BlockManager(16, 4, hash_fn=lambda parent, tokens: 0)
    computed_seq(bm, 1, [1] * 9)                                # blocks 0 and 1 hold the same tokens
    assert bm.num_cached_blocks == 1                            # block 1's hash is taken: not cached
    assert bm.add_sequence(2, [1] * 9) == 4                     # block 0 again, not block 0 as block 1
    assert bm.block_table(2) == bm.block_table(1)[:1]
    assert bm.add_sequence(3, [2] * 9) == 0                     # same hash, other tokens: a miss
    assert bm.stats.hit_tokens == 4
    check_block_manager(bm)


def test_a_hash_that_ignores_the_parent_cannot_confuse_positions():
    bm = BlockManager(16, 4, hash_fn=lambda parent, tokens: hash(tokens))
    computed_seq(bm, 1, [5, 5, 5, 5, 1, 1, 1, 1, 0])           # caches (1, 1, 1, 1) after (5, 5, 5, 5)
    assert computed_seq(bm, 2, [1, 1, 1, 1, 1, 1, 1, 1, 0]) == 0  # same hash, other parent: a miss ...
    assert bm.num_cached_blocks == 2                            # ... and not cached (the hash is taken)
    assert bm.add_sequence(3, [5, 5, 5, 5, 1, 1, 1, 1, 0]) == 8
    assert bm.add_sequence(4, [1, 1, 1, 1, 1, 1, 1, 1, 2]) == 0
    check_block_manager(bm)


# ---------------------------------------------------------------------------------------------- duplicates
def test_concurrent_identical_prompts_end_up_sharing_blocks():
    bm = BlockManager(16, 4)
    prompt = list(range(10))
    assert bm.add_sequence(1, prompt) == 0 and bm.add_sequence(2, prompt) == 0  # admitted in the same step
    for seq_id in (1, 2):
        bm.reserve(seq_id, 10)
    used = bm.num_used_blocks
    for seq_id in (1, 2):
        bm.mark_computed(seq_id, 10)
    assert bm.block_table(2)[:2] == bm.block_table(1)[:2] and bm.num_used_blocks == used - 2
    # seq 2's own continuation chains onto the shared blocks, so a follow-up turn hits all of it
    bm.append_tokens(2, [20, 21])
    bm.reserve(2, 12)
    bm.mark_computed(2, 12)
    assert bm.add_sequence(3, prompt + [20, 21, 30]) == 12
    check_block_manager(bm)


def test_switching_to_a_cached_duplicate_never_splits_fork_siblings():
    bm = BlockManager(32, 2, hash_fn=lambda parent, tokens: hash(tokens))
    computed_seq(bm, 9, [7, 7, 2, 2, 0])                        # takes the hash of (2, 2)
    computed_seq(bm, 1, [1, 1, 2, 2, 3, 3, 0])                  # its (2, 2) collides: not cached
    assert bm.num_cached_blocks == 3
    bm.fork(1, 2)
    bm.free(9)
    bm.clear_prefix_cache()
    computed_seq(bm, 3, [1, 1, 2, 2, 5])                        # now caches (2, 2) after (1, 1)
    bm.append_tokens(1, [4])
    bm.reserve(1, 8)
    bm.mark_computed(1, 8)                                      # seq 1's (2, 2) block is shared with seq 2
    assert bm.block_table(1)[:3] == bm.block_table(2)[:3]
    check_block_manager(bm)


# ------------------------------------------------------------------------------------------ blocks_needed
def test_blocks_needed_counts_hits_on_blocks_in_use_as_free():
    bm = BlockManager(16, 4)
    assert bm.blocks_needed(0) == 0 and bm.blocks_needed(1) == 1 and bm.blocks_needed(9) == 3
    computed_seq(bm, 1, list(range(12)))
    assert bm.blocks_needed(list(range(12)) + [5]) == 4 - 3    # three blocks hit, all in use
    assert bm.blocks_needed(list(range(12))) == 3 - 2          # the last block is always computed
    bm.free(1)
    # The same hits on evictable blocks cost free blocks all the same.
    assert bm.blocks_needed(list(range(12)) + [5]) == 4
    assert bm.stats.queried_tokens == 12 and bm.evictable_blocks() == [2, 1, 0]  # a pure query


def test_admission_by_blocks_needed_always_fits():
    bm = BlockManager(5, 4)
    computed_seq(bm, 1, list(range(12)))
    prompt = list(range(12)) + [1, 2, 3, 4, 5, 6]              # 5 blocks, 3 of them hits in use
    assert bm.blocks_needed(prompt) == 2 <= bm.num_free_blocks
    bm.add_sequence(2, prompt)
    assert bm.can_reserve(2, len(prompt))


# ------------------------------------------------------------------------------------- PrefixCache itself
def test_prefix_cache_lookup_is_a_pure_query_and_register_is_first_come():
    cache = PrefixCache(2, hash_fn=lambda parent, tokens: 0)
    assert cache.register(4, ROOT, (1, 2), 0)
    assert not cache.register(5, ROOT, (3, 4), 0)             # hash taken
    assert cache.lookup([1, 2, 3], 1) == [4] and cache.lookup([3, 4, 3], 1) == []
    cache.release(4)
    assert cache.lookup([1, 2, 3], 1) == [4] and cache.evictable_blocks() == [4]
    assert cache.stats.queried_tokens == 0
    assert cache.evict() == 4 and len(cache) == 0 and cache.stats.evicted_tokens == 2


# ----------------------------------------------------------------------------------------- property test
PREFIXES = [[], [0, 1, 0, 1, 1], [0, 1, 1, 1, 0, 0, 1], [1] * 7]
PROMPTS = st.builds(lambda prefix, rest: prefix + rest, st.sampled_from(PREFIXES),
                    st.lists(st.integers(0, 1), max_size=5)).filter(bool)


@settings(max_examples=150, deadline=None)
@given(block_size=st.integers(1, 3), requests=st.lists(st.tuples(PROMPTS, st.booleans()), max_size=12))
def test_hits_match_a_reference_model(block_size, requests):
    """Without memory pressure, a request hits exactly the longest block-aligned prefix (short of its last
    token) that any earlier request computed, whether that request is still running or finished."""
    bm = BlockManager(512, block_size)
    computed: set[tuple[int, ...]] = set()
    for seq_id, (prompt, finish) in enumerate(requests):
        expected = 0
        for end in range(block_size, len(prompt), block_size):
            if tuple(prompt[:end]) not in computed:
                break
            expected = end
        assert computed_seq(bm, seq_id, prompt) == expected
        computed.update(tuple(prompt[:end]) for end in range(block_size, len(prompt) + 1, block_size))
        if finish:
            bm.free(seq_id)
        check_block_manager(bm)
    assert bm.stats.evicted_blocks == 0
