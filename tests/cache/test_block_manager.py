"""Block manager: allocation, block tables, slots, fork/copy-on-write, truncate, errors, and a property-based
state machine with a shadow model of what every KV slot holds."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from workbench.cache.block_invariants import check_block_manager
from workbench.cache.block_manager import BlockManager, NoFreeBlocksError
from workbench.cache.hybrid_block_manager import HybridBlockManager
from workbench.cache.kv_groups import KVGroup, KVGroupLayout


def snapshot(bm: BlockManager) -> tuple:
    """Everything a failed call must leave untouched."""
    seqs = {sid: (list(s.tokens), list(s.table), s.num_computed, s.num_reserved, s.num_registered)
            for sid, s in bm._seqs.items()}
    return (list(bm._pool.free), bm.evictable_blocks(), list(bm._pool.ref), seqs, bm.prefix_cache.items(), bm.stats)


def computed_seq(bm: BlockManager, seq_id: int, tokens: list[int]) -> int:
    """Add a sequence and compute all of its tokens, as a prefill would; returns the hits."""
    hits = bm.add_sequence(seq_id, tokens)
    bm.reserve(seq_id, len(tokens))
    bm.mark_computed(seq_id, len(tokens))
    return hits


# ------------------------------------------------------------------------------------------------ basics
def test_add_reserve_and_slots():
    bm = BlockManager(8, 4)
    assert bm.add_sequence(1, list(range(10))) == 0
    assert bm.block_table(1) == [] and bm.num_used_blocks == 0  # add allocates nothing on a miss
    assert bm.reserve(1, 10) == []
    assert bm.block_table(1) == [0, 1, 2]
    assert bm.num_used_blocks == 3 and bm.num_free_blocks == 5 and bm.usage == pytest.approx(3 / 8)
    assert bm.slot(1, 0) == 0 and bm.slot(1, 5) == 5 and bm.slot(1, 9) == 9
    assert bm.slots(1, 2, 9) == [bm.slot(1, p) for p in range(2, 9)]
    assert bm.slots(1, 4, 4) == []
    assert bm.num_reserved_tokens(1) == 10 and bm.num_computed_tokens(1) == 0
    check_block_manager(bm)


def test_slots_follow_a_scattered_table():
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    bm.add_sequence(1, [1] * 4)
    bm.reserve(1, 4)                  # block 0
    bm.add_sequence(2, [2] * 4)
    bm.reserve(2, 4)                  # block 1
    bm.reserve(1, 6)                  # block 2: seq 1 is [0, 2]
    assert bm.block_table(1) == [0, 2]
    assert bm.slots(1, 2, 6) == [2, 3, 8, 9]
    assert bm.slot(1, 5) == 9


def test_decode_allocates_one_block_per_block_size_tokens():
    bm = BlockManager(8, 4)
    bm.add_sequence(1, [7, 7, 7])
    bm.reserve(1, 3)
    bm.mark_computed(1, 3)
    sizes = []
    for token in range(10):
        bm.append_tokens(1, [token])
        n = len(bm.token_ids(1))
        assert bm.reserve(1, n) == []
        bm.mark_computed(1, n)
        sizes.append(len(bm.block_table(1)))
    assert sizes == [1, 2, 2, 2, 2, 3, 3, 3, 3, 4]
    check_block_manager(bm)


def test_reserve_is_idempotent_and_never_shrinks():
    bm = BlockManager(8, 4)
    bm.add_sequence(1, [1, 2, 3])
    bm.reserve(1, 9)
    table = bm.block_table(1)
    assert bm.reserve(1, 5) == [] and bm.reserve(1, 9) == []
    assert bm.block_table(1) == table and bm.num_reserved_tokens(1) == 9


def test_block_table_is_a_copy():
    bm = BlockManager(4, 4)
    bm.add_sequence(1, [1])
    bm.reserve(1, 1)
    bm.block_table(1).append(3)
    assert bm.block_table(1) == [0]


def test_free_returns_every_block_and_forgets_the_sequence():
    bm = BlockManager(6, 2)
    computed_seq(bm, 1, [1, 2, 3, 4, 5])
    bm.free(1)
    assert bm.num_free_blocks == 6 and bm.num_used_blocks == 0 and 1 not in bm
    with pytest.raises(ValueError, match="unknown seq_id 1"):
        bm.free(1)
    check_block_manager(bm)


def test_speculative_over_reservation_then_truncate_frees_exactly_the_surplus():
    bm = BlockManager(16, 4)
    computed_seq(bm, 1, list(range(10)))          # 3 blocks, 10 computed
    bm.append_tokens(1, [50, 51, 52, 53, 54, 55])  # 6 draft tokens -> 16 tokens
    bm.reserve(1, 16)
    bm.mark_computed(1, 16)
    assert len(bm.block_table(1)) == 4
    used = bm.num_used_blocks
    bm.truncate(1, 12)                            # 2 drafts accepted: positions 12..15 go
    assert bm.num_used_blocks == used - 1 and len(bm.block_table(1)) == 3
    assert bm.num_reserved_tokens(1) == 12 and bm.num_computed_tokens(1) == 12
    assert bm.token_ids(1) == list(range(10)) + [50, 51]
    check_block_manager(bm)


def test_truncate_reservation_without_appended_drafts():
    """A runner may reserve lookahead slots before the draft tokens are appended: truncate accepts that."""
    bm = BlockManager(16, 4)
    computed_seq(bm, 1, list(range(5)))
    bm.reserve(1, 13)                             # 4 blocks, only 5 tokens known
    free = bm.num_free_blocks
    bm.truncate(1, 7)
    assert bm.num_free_blocks == free + 2 and bm.num_reserved_tokens(1) == 7
    with pytest.raises(ValueError, match=r"\[0, 7\], got 8"):
        bm.truncate(1, 8)


def test_truncate_mid_block_keeps_the_block_and_to_zero_frees_all():
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    computed_seq(bm, 1, list(range(8)))
    bm.truncate(1, 6)
    assert bm.block_table(1) == [0, 1]
    bm.truncate(1, 0)
    assert bm.block_table(1) == [] and bm.num_free_blocks == 8 and bm.token_ids(1) == []


def test_truncate_into_a_cached_block_copies_on_the_next_write():
    bm = BlockManager(8, 4)
    computed_seq(bm, 1, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    cached = bm.block_table(1)[1]
    assert cached in bm.prefix_cache
    bm.truncate(1, 6)                             # back into the cached block [5, 6, 7, 8]
    assert cached in bm.prefix_cache and bm.block_table(1)[1] == cached
    bm.append_tokens(1, [60, 70])
    copies = bm.reserve(1, 8)
    new = bm.block_table(1)[1]
    assert copies == [(cached, new)] and new != cached  # positions 4, 5 are still needed from it
    bm.mark_computed(1, 8)
    assert bm.prefix_cache.entry(cached).token_ids == (5, 6, 7, 8)  # the cached block was not overwritten
    assert cached in bm.evictable_blocks()
    assert bm.add_sequence(2, [1, 2, 3, 4, 5, 6, 7, 8, 0]) == 8  # and still serves the old prefix
    check_block_manager(bm)


# ------------------------------------------------------------------------------------- fork / copy-on-write
def test_fork_shares_blocks_and_divergent_appends_copy_on_write():
    bm = BlockManager(8, 4)
    computed_seq(bm, 1, [1, 2, 3, 4, 5, 6])       # [full block, half block]
    bm.fork(1, 2)
    shared = bm.block_table(1)
    assert bm.block_table(2) == shared and all(bm.ref_count(b) == 2 for b in shared)
    assert bm.token_ids(2) == [1, 2, 3, 4, 5, 6] and bm.num_computed_tokens(2) == 6

    bm.append_tokens(1, [7])
    bm.append_tokens(2, [9])
    copies = bm.reserve(2, 7)
    child = bm.block_table(2)
    assert child[0] == shared[0] and child[1] != shared[1]
    assert copies == [(shared[1], child[1])]      # positions 4, 5 must come along
    assert bm.reserve(1, 7) == []                 # the parent is now the only owner of its block
    assert bm.block_table(1) == shared
    assert bm.ref_count(shared[0]) == 2 and bm.ref_count(shared[1]) == 1 and bm.ref_count(child[1]) == 1
    bm.mark_computed(1, 7)
    bm.mark_computed(2, 7)
    check_block_manager(bm)


def test_fork_at_a_block_boundary_needs_no_copy():
    bm = BlockManager(8, 4)
    computed_seq(bm, 1, list(range(8)))
    bm.fork(1, 2)
    for seq_id in (1, 2):
        bm.append_tokens(seq_id, [seq_id])
        assert bm.reserve(seq_id, 9) == []
    assert bm.block_table(1)[:2] == bm.block_table(2)[:2]
    assert bm.block_table(1)[2] != bm.block_table(2)[2]


def test_forked_lookahead_block_is_replaced_without_a_copy():
    bm = BlockManager(8, 4)
    computed_seq(bm, 1, list(range(8)))
    bm.reserve(1, 12)                             # lookahead block, nothing computed in it
    bm.fork(1, 2)
    lookahead = bm.block_table(1)[2]
    assert bm.reserve(2, 10) == []                # nothing to copy: the block held no KV of seq 2
    assert bm.block_table(2)[2] != lookahead and bm.block_table(1)[2] == lookahead
    assert bm.ref_count(lookahead) == 1
    check_block_manager(bm)


def test_copy_on_write_replaces_every_shared_block_from_the_first_write_on():
    """Replacing only the blocks up to num_tokens would leave a lookahead block shared by two tables that
    differ before it (found by the state machine)."""
    bm = BlockManager(8, 2)
    bm.add_sequence(0, [0, 1, 2, 0, 1, 2, 0, 1])
    bm.reserve(0, 4)                              # two blocks, nothing computed yet
    bm.fork(0, 2)
    assert bm.blocks_to_reserve(0, 1) == 2
    assert bm.reserve(0, 1) == []                 # nothing computed: two fresh blocks, no copies
    assert not set(bm.block_table(0)) & set(bm.block_table(2))
    check_block_manager(bm)


def test_mark_computed_refuses_kv_written_into_a_shared_block():
    bm = BlockManager(8, 2)
    bm.add_sequence(0, [0, 1, 2, 0])
    bm.reserve(0, 4)
    bm.fork(0, 2)                                 # forgot to reserve() after the fork
    before = snapshot(bm)
    with pytest.raises(ValueError, match="block 0, which is shared or cached; reserve"):
        bm.mark_computed(2, 4)
    assert snapshot(bm) == before
    bm.reserve(2, 4)
    bm.mark_computed(2, 4)


def test_copy_on_write_never_writes_into_a_shared_block():
    bm = BlockManager(16, 4)
    computed_seq(bm, 0, [1, 2, 3, 4, 5])
    for child in (1, 2, 3):
        bm.fork(0, child)
    for seq_id in (0, 1, 2, 3):
        bm.append_tokens(seq_id, [10 + seq_id] * 3)
        bm.reserve(seq_id, 8)
        for position in range(5, 8):              # the slots about to be written
            block = bm.block_table(seq_id)[position // 4]
            assert bm.ref_count(block) == 1 and block not in bm.prefix_cache
    assert len({bm.block_table(s)[1] for s in range(4)}) == 4


def test_can_reserve_counts_copy_on_write_blocks():
    bm = BlockManager(3, 4)
    computed_seq(bm, 1, [1, 2, 3, 4, 5, 6])
    bm.fork(1, 2)
    assert bm.blocks_to_reserve(2, 7) == 1        # one copy
    assert bm.blocks_to_reserve(2, 9) == 2        # one copy + one new block
    assert bm.can_reserve(2, 7) and not bm.can_reserve(2, 9)


def test_no_free_blocks_leaves_state_unchanged():
    bm = BlockManager(4, 2)
    computed_seq(bm, 1, [1, 2, 3])
    bm.fork(1, 2)
    bm.append_tokens(2, [4, 5, 6])
    before = snapshot(bm)
    assert not bm.can_reserve(2, 7)
    with pytest.raises(NoFreeBlocksError, match="needs 3 blocks"):
        bm.reserve(2, 7)                          # needs a copy of block 1 plus 2 new blocks; 2 are free
    assert snapshot(bm) == before
    check_block_manager(bm)


# ------------------------------------------------------------------------------------------ whose tokens
class CallersTokens(list):
    """A caller's token list that fails the test the moment anyone but the caller edits it."""

    def _refuse(self, *args, **kwargs):
        raise AssertionError("the block manager edited the caller's token list")

    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse


MANAGERS = {
    "single": lambda: BlockManager(16, 4),
    "grouped": lambda: HybridBlockManager(16, 4, KVGroupLayout((KVGroup(6, (0,)), KVGroup(None, (1,))), 2)),
}


@pytest.mark.parametrize("make", MANAGERS.values(), ids=MANAGERS)
def test_a_manager_keeps_its_own_tokens_and_never_edits_the_callers(make):
    """Issue 43: the manager kept the caller's list and truncate() deleted from it (the engine's sequences, whose
    tokens only append_token may write). Its tokens are its own copy now, told of new ones by append_tokens."""
    bm = make()
    tokens = CallersTokens(range(1, 11))
    bm.add_sequence(1, tokens)
    bm.reserve(1, 12)
    bm.mark_computed(1, 10)
    bm.append_tokens(1, [11, 12])
    bm.truncate(1, 6)  # a rollback: the manager's tokens go back to 6, the caller's stay as they are
    bm.fork(1, 2, CallersTokens(range(1, 7)))
    bm.append_tokens(2, [99])
    assert tokens == list(range(1, 11)) and bm.token_ids(1) == list(range(1, 7))
    assert bm.token_ids(2) == [*range(1, 7), 99]
    plain = [5, 6, 7]
    bm.add_sequence(3, plain)
    plain.append(8)  # the caller's own edit is not the manager's: it hears of tokens through append_tokens
    assert bm.token_ids(3) == [5, 6, 7]
    for seq_id in (1, 2, 3):
        bm.free(seq_id)
    assert bm.num_free_blocks == 16


# ------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_blocks": 0}, "num_blocks must be an integer >= 1, got 0"),
    ({"num_blocks": -3}, "num_blocks must be an integer >= 1, got -3"),
    ({"num_blocks": 2.5}, "num_blocks must be an integer >= 1, got 2.5"),
    ({"num_blocks": 4, "block_size": 0}, "block_size must be an integer >= 1, got 0"),
])
def test_constructor_rejects_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BlockManager(**kwargs)


@pytest.mark.parametrize("call", [
    lambda bm: bm.append_tokens(99, [1]), lambda bm: bm.reserve(99, 1), lambda bm: bm.can_reserve(99, 1),
    lambda bm: bm.mark_computed(99, 0), lambda bm: bm.fork(99, 5), lambda bm: bm.truncate(99, 0),
    lambda bm: bm.free(99), lambda bm: bm.block_table(99), lambda bm: bm.slot(99, 0),
    lambda bm: bm.slots(99, 0, 0), lambda bm: bm.num_computed_tokens(99),
])
def test_unknown_seq_id_is_a_value_error(call):
    bm = BlockManager(4, 4)
    bm.add_sequence(1, [1])
    with pytest.raises(ValueError, match="unknown seq_id 99"):
        call(bm)


def test_bad_arguments_name_the_value_and_range():
    bm = BlockManager(8, 4)
    bm.add_sequence(1, [1, 2, 3])
    with pytest.raises(ValueError, match="seq_id 1 is already added"):
        bm.add_sequence(1, [1])
    with pytest.raises(ValueError, match="child seq_id 1 is already added"):
        bm.fork(1, 1)
    with pytest.raises(ValueError, match="empty"):
        bm.add_sequence(2, [])
    with pytest.raises(ValueError, match="num_tokens must be >= 0, got -1"):
        bm.reserve(1, -1)
    with pytest.raises(ValueError, match="num_tokens must be >= 0, got -2"):
        bm.can_reserve(1, -2)
    bm.reserve(1, 6)
    with pytest.raises(ValueError, match=r"num_tokens must be in \[0, 3\], got 4"):
        bm.mark_computed(1, 4)                    # only 3 tokens are known
    with pytest.raises(ValueError, match=r"num_tokens must be in \[0, 6\], got 7"):
        bm.truncate(1, 7)
    with pytest.raises(ValueError, match=r"num_tokens must be in \[0, 6\], got -1"):
        bm.truncate(1, -1)
    with pytest.raises(ValueError, match=r"position must be in \[0, 6\).*got 6"):
        bm.slot(1, 6)
    with pytest.raises(ValueError, match="start=4, end=2"):
        bm.slots(1, 4, 2)
    with pytest.raises(ValueError, match="token count must be >= 0, got -5"):
        bm.blocks_needed(-5)


def test_mark_computed_needs_reserved_slots():
    bm = BlockManager(8, 4)
    bm.add_sequence(1, [1, 2, 3])
    with pytest.raises(ValueError, match=r"\[0, 0\], got 3"):
        bm.mark_computed(1, 3)
    bm.reserve(1, 3)
    bm.mark_computed(1, 3)
    bm.mark_computed(1, 2)                        # going back is a no-op: KV does not disappear
    assert bm.num_computed_tokens(1) == 3


def test_check_invariants_catches_corruption():
    bm = BlockManager(8, 2)
    computed_seq(bm, 1, [1, 2, 3, 4, 5])
    check_block_manager(bm)
    bm._pool.ref[bm.block_table(1)[0]] += 1
    with pytest.raises(AssertionError, match="ref count"):
        check_block_manager(bm)
    bm._pool.ref[bm.block_table(1)[0]] -= 1
    bm._pool.free.append(bm.block_table(1)[2])
    with pytest.raises(AssertionError):
        check_block_manager(bm)


# ------------------------------------------------------------------------------------ property-based tests
ALPHABET = st.integers(0, 2)  # few token ids, so that prefixes repeat and blocks get shared
# Prompts start with one of a few shared "system prompts" (including a run of one repeated token, whose
# blocks are identical apart from their position: a hash or check that ignored the parent would mix them up).
PREFIXES = [[], [0, 1, 2, 0, 1, 2, 0, 1], [0, 1, 2, 0, 2, 2, 1, 0, 1, 2], [1] * 9]
PROMPTS = st.builds(lambda prefix, rest: prefix + rest, st.sampled_from(PREFIXES), st.lists(ALPHABET, max_size=6))


class BlockManagerMachine(RuleBasedStateMachine):
    """Random engine-like traffic over a small pool. ``shadow`` models the cache contents: which token's KV
    each slot holds, written only where the runner writes (computed positions) and copied as reserve() says."""

    caching = True
    hash_fn = None

    @initialize(num_blocks=st.integers(8, 24), block_size=st.integers(2, 4))
    def setup(self, num_blocks, block_size):
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=self.caching, hash_fn=self.hash_fn)
        self.shadow: dict[int, int] = {}
        self.tokens: dict[int, list[int]] = {}
        self.next_id = 0
        # Positions a sequence may write without another reserve(): a fork or truncate resets it.
        self.writable: dict[int, int] = {}

    def _pick(self, data) -> int:
        return data.draw(st.sampled_from(sorted(self.tokens)), label="seq_id")

    @precondition(lambda self: len(self.tokens) < 6)
    @rule(tokens=PROMPTS.filter(bool))
    def add(self, tokens):
        seq_id, self.next_id = self.next_id, self.next_id + 1
        hits = self.bm.add_sequence(seq_id, tokens)
        size = self.bm.block_size
        assert hits % size == 0 and 0 <= hits < len(tokens)
        assert self.caching or hits == 0
        # A hit must be the right KV: the slots it maps hold exactly this prompt's tokens.
        assert [self.shadow.get(s) for s in self.bm.slots(seq_id, 0, hits)] == tokens[:hits]
        self.tokens[seq_id] = list(tokens)
        self.writable[seq_id] = hits

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), new=st.lists(ALPHABET, max_size=5))
    def append(self, data, new):
        seq_id = self._pick(data)
        self.bm.append_tokens(seq_id, new)
        self.tokens[seq_id].extend(new)

    def _reserve(self, seq_id: int, target: int) -> bool:
        bm, size = self.bm, self.bm.block_size
        expected_ok = bm.can_reserve(seq_id, target)
        before = snapshot(bm)
        try:
            copies = bm.reserve(seq_id, target)
        except NoFreeBlocksError:
            assert not expected_ok and snapshot(bm) == before
            return False
        assert expected_ok
        for src, dst in copies:  # whole blocks, as the runner copies them
            for offset in range(size):
                self.shadow[dst * size + offset] = self.shadow.get(src * size + offset)
        table = bm.block_table(seq_id)
        for position in range(bm.num_computed_tokens(seq_id), target):
            block = table[position // size]
            assert bm.ref_count(block) == 1 and block not in bm.prefix_cache, "a write would hit a shared block"
        if target > bm.num_computed_tokens(seq_id):  # (with no write coming, reserve() copies nothing)
            self.writable[seq_id] = bm.num_reserved_tokens(seq_id)
        return True

    def _compute(self, seq_id: int, upto: int) -> None:
        done = self.bm.num_computed_tokens(seq_id)
        for position, slot in enumerate(self.bm.slots(seq_id, done, upto), start=done):  # the forward's writes
            self.shadow[slot] = self.tokens[seq_id][position]
        self.bm.mark_computed(seq_id, upto)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), new=st.lists(ALPHABET, max_size=3))
    def engine_step(self, data, new):
        """What the engine does: append the sampled tokens, reserve their slots, run the forward."""
        seq_id = self._pick(data)
        self.bm.append_tokens(seq_id, new)
        self.tokens[seq_id].extend(new)
        if self._reserve(seq_id, len(self.tokens[seq_id])):
            self._compute(seq_id, len(self.tokens[seq_id]))

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), extra=st.integers(0, 7))
    def reserve(self, data, extra):
        seq_id = self._pick(data)
        self._reserve(seq_id, self.bm.num_computed_tokens(seq_id) + extra)  # may pass the known tokens

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def compute(self, data):
        seq_id = self._pick(data)
        bm = self.bm
        done, limit = bm.num_computed_tokens(seq_id), min(len(self.tokens[seq_id]), self.writable[seq_id])
        if limit > done:
            self._compute(seq_id, data.draw(st.integers(done + 1, limit), label="upto"))

    @precondition(lambda self: self.tokens and len(self.tokens) < 6)
    @rule(data=st.data())
    def fork(self, data):
        parent = self._pick(data)
        child, self.next_id = self.next_id, self.next_id + 1
        self.bm.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        self.writable[parent] = self.writable[child] = self.bm.num_computed_tokens(parent)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def truncate(self, data):
        seq_id = self._pick(data)
        limit = max(len(self.tokens[seq_id]), self.bm.num_reserved_tokens(seq_id))
        keep = data.draw(st.integers(0, limit), label="keep")
        self.bm.truncate(seq_id, keep)
        del self.tokens[seq_id][keep:]
        self.writable[seq_id] = self.bm.num_computed_tokens(seq_id)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        seq_id = self._pick(data)
        self.bm.free(seq_id)
        del self.tokens[seq_id]

    @rule()
    def clear_prefix_cache(self):
        self.bm.clear_prefix_cache()

    @invariant()
    def consistent(self):
        if not hasattr(self, "bm"):
            return
        bm, size = self.bm, self.bm.block_size
        check_block_manager(bm)
        for seq_id, tokens in self.tokens.items():
            assert bm.token_ids(seq_id) == tokens
            computed = bm.num_computed_tokens(seq_id)
            assert [self.shadow.get(s) for s in bm.slots(seq_id, 0, computed)] == tokens[:computed]
        for block, entry in bm.prefix_cache.items():
            assert [self.shadow.get(block * size + o) for o in range(size)] == list(entry.token_ids)

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for seq_id in list(self.tokens):
            self.bm.free(seq_id)
        check_block_manager(self.bm)
        assert self.bm.num_free_blocks == self.bm.num_blocks and self.bm.num_used_blocks == 0


class PressureMachine(BlockManagerMachine):
    """Adds requests that churn the cache, so eviction runs all the time (the base machine mostly hits)."""

    @precondition(lambda self: len(self.tokens) < 6 and self.bm.num_free_blocks > 0)
    @rule(data=st.data(), keep=st.booleans())
    def fill(self, data, keep):
        """Memory pressure: a request with a prompt no other shares takes up to every free block, evicting
        cached blocks to get them; it either stays or leaves at once (cache churn)."""
        blocks = data.draw(st.integers(1, self.bm.num_free_blocks), label="blocks")
        seq_id, self.next_id = self.next_id, self.next_id + 1
        self.tokens[seq_id] = [3 + seq_id] * (blocks * self.bm.block_size)
        self.writable[seq_id] = 0
        self.bm.add_sequence(seq_id, self.tokens[seq_id])
        assert self._reserve(seq_id, len(self.tokens[seq_id]))
        self._compute(seq_id, len(self.tokens[seq_id]))
        if not keep:
            self.bm.free(seq_id)
            del self.tokens[seq_id]


class CachingOffMachine(BlockManagerMachine):
    caching = False


class CollidingHashMachine(BlockManagerMachine):
    hash_fn = staticmethod(lambda parent, tokens: 0)


class WeakHashMachine(PressureMachine):
    """Ignores the parent and collides often: only the token and parent checks keep hits correct."""

    hash_fn = staticmethod(lambda parent, tokens: sum(tokens) % 3)


_machine_settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])
TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = _machine_settings
TestPressureMachine = PressureMachine.TestCase
TestPressureMachine.settings = _machine_settings
TestCachingOffMachine = CachingOffMachine.TestCase
TestCachingOffMachine.settings = settings(_machine_settings, max_examples=30)
TestCollidingHashMachine = CollidingHashMachine.TestCase
TestCollidingHashMachine.settings = settings(_machine_settings, max_examples=30)
TestWeakHashMachine = WeakHashMachine.TestCase
TestWeakHashMachine.settings = settings(_machine_settings, max_examples=30)
