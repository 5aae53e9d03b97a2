"""The KV-group block manager on its own: a window group frees the blocks that leave its window, a prefix hit
needs only the window's blocks in a sliding group, admission counts each group's real demand, and every block
comes back."""

from __future__ import annotations

import pytest

from workbench.cache.block_manager import NoFreeBlocksError
from workbench.cache.hybrid_block_manager import HOLE, HybridBlockManager
from workbench.cache.kv_groups import KVGroup, KVGroupLayout, group_blocks_needed
from workbench.intmath import ceil_div

BS, WINDOW = 4, 6
LAYOUT = KVGroupLayout((KVGroup(WINDOW, (0,)), KVGroup(None, (1,))), 2)


def manager(num_blocks=64, caching=True, chunk=8) -> HybridBlockManager:
    return HybridBlockManager(num_blocks, BS, LAYOUT, enable_prefix_caching=caching, max_chunk=chunk)


def run(blocks: HybridBlockManager, seq_id: int, tokens: list[int], chunk: int = 8) -> None:
    """Compute every token the way the scheduler does: reserve a chunk, then mark it computed."""
    done = blocks.add_sequence(seq_id, tokens)
    while done < len(tokens):
        done = min(done + chunk, len(tokens))
        blocks.reserve(seq_id, done)
        blocks.mark_computed(seq_id, done)


def live(table: list[int]) -> int:
    return sum(b != HOLE for b in table)


def test_a_window_group_frees_the_blocks_that_leave_its_window():
    blocks = manager()
    tokens = list(range(8))
    run(blocks, 0, tokens)
    assert live(blocks.group_table(0, 0)) == 2  # positions 0..7: nothing has left a 6-token window yet
    for n in range(9, 41):  # decode one token at a time
        blocks.append_tokens(0, [n - 1])  # the manager keeps its own copy of the tokens
        blocks.reserve(0, n)
        blocks.mark_computed(0, n)
        window_table = blocks.group_table(0, 0)
        first_needed = max(0, n - WINDOW + 1) // BS  # the block of the oldest key the next query sees
        assert all(b == HOLE for b in window_table[:max(0, (n - 1) - WINDOW + 1) // BS])
        assert live(window_table) <= ceil_div(WINDOW, BS) + 1
        assert window_table[first_needed] != HOLE or first_needed >= len(window_table)
        assert live(blocks.group_table(0, 1)) == ceil_div(n, BS)  # full attention keeps everything
    assert blocks.num_slid_blocks > 0
    with pytest.raises(ValueError, match="left group 0's window"):
        blocks.slots(0, 0, 1, group=0)
    blocks.free(0)
    assert blocks.num_free_blocks == 64 and blocks.num_used_blocks == 0


def test_a_prefix_hit_needs_only_the_last_window_in_a_sliding_group():
    blocks = manager(num_blocks=24)
    tokens = list(range(33))
    run(blocks, 0, tokens)
    blocks.free(0)
    # Evict the sliding group's oldest cached blocks by filling the pool with other work.
    run(blocks, 1, [1000 + t for t in range(20)])  # 10 blocks: the 8 never-cached ones, then the 2 oldest cached
    blocks.free(1)
    nodes = blocks.prefix_cache.trie.path(tokens, 8, BS)
    evicted = [i for i, node in enumerate(nodes) if blocks.prefix_cache.block(0, node) is None]
    assert evicted == [0, 1], "the window group's first blocks were released first, so evicted first"
    hit = blocks.add_sequence(2, list(tokens))
    assert hit == 32  # 8 full blocks: the last token's block is always computed afresh
    window_table, full_table = blocks.group_table(2, 0), blocks.group_table(2, 1)
    assert live(full_table) == 8
    assert [b != HOLE for b in window_table] == [False] * 6 + [True] * 2  # keys 27..31 in blocks 6 and 7 only
    assert blocks.stats.hit_tokens == 32


def test_a_hit_stops_where_a_full_group_lost_a_block():
    blocks = manager(num_blocks=18)
    run(blocks, 0, list(range(32)))
    blocks.free(0)
    run(blocks, 1, [500 + t for t in range(16)])  # takes every never-cached block, then evicts the oldest cached
    hit = blocks.add_sequence(2, list(range(32)))
    assert hit < 28 and hit % BS == 0
    assert live(blocks.group_table(2, 1)) == hit // BS


def test_admission_counts_each_groups_real_demand():
    blocks = manager(chunk=8)
    assert group_blocks_needed(WINDOW, 100, BS, 8) == ceil_div(WINDOW - 1 + 8, BS) + 1  # 5: not 25
    assert group_blocks_needed(None, 100, BS, 8) == 25
    assert blocks.blocks_needed(100) == 5 + 25
    assert blocks.blocks_needed(3) == 1 + 1  # never more than the sequence has
    run(blocks, 0, list(range(20)))
    shared = list(range(20)) + [7, 7, 7]
    assert blocks.blocks_needed(shared) < blocks.blocks_needed(len(shared)), "blocks in use are hit for free"


def test_reserve_counts_what_sliding_gives_back_and_refuses_without_changes():
    blocks = manager(num_blocks=12, caching=False)
    run(blocks, 0, list(range(24)))
    before = (blocks.group_table(0, 0), blocks.group_table(0, 1), blocks.num_free_blocks)
    assert blocks.blocks_to_reserve(0, 25) == 2 - (live(before[0]) - 2)  # two new blocks, the slid ones return
    with pytest.raises(NoFreeBlocksError):
        blocks.reserve(0, 60)
    assert (blocks.group_table(0, 0), blocks.group_table(0, 1), blocks.num_free_blocks) == before


def test_forks_share_every_group_and_copy_on_write():
    blocks = manager()
    run(blocks, 0, list(range(10)))
    blocks.fork(0, 1)
    assert blocks.group_table(1, 1) == blocks.group_table(0, 1)
    copies = blocks.reserve(1, 11)
    assert copies and all(blocks.ref_count(dst) == 1 for _, dst in copies)
    for seq in (0, 1):
        blocks.free(seq)
    assert blocks.num_used_blocks == 0
    blocks.clear_prefix_cache()
    assert blocks.num_cached_blocks == 0 and len(blocks.prefix_cache.trie) == 0, "trie nodes all released"
