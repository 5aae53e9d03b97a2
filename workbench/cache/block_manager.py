"""Block manager: which physical KV-cache blocks each sequence uses, so the cache can be shared and paged.

The KV cache is a pool of ``num_blocks`` blocks of ``block_size`` token slots; slot ``block * block_size +
offset`` is where one token's keys and values live. Each sequence owns a *block table* (position ``p`` lives in
block ``table[p // block_size]`` at offset ``p % block_size``), so memory is taken one block at a time as a
sequence grows instead of being reserved for the longest possible sequence.

Blocks are reference counted so that several sequences can read the same one: a forked sequence (parallel
sampling, beam search) shares its parent's blocks, and with prefix caching a new request reuses the blocks of
an earlier one whose prompt began the same way (:mod:`workbench.cache.prefix_cache`). A shared block is never
written: the sequence about to write into one gets a private copy first (copy-on-write), and the model runner
performs the copies ``reserve()`` returns.

Per sequence, the manager owns how many positions have slots (``reserved``) and how many of those hold computed
KV (``computed``); new KV is always written at positions ``computed`` onwards. It keeps its own copy of the
sequence's tokens, to hash the blocks it registers (`workbench.cache.block_manager_base`): ``append_tokens``
extends the copy, ``truncate`` shortens it, and neither touches the caller's list. This is the engine's CPU
side: it only moves integers and never touches a tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.cache.block_manager_base import (
    BlockManagerBase,
    NoFreeBlocksError,
    SequenceRecord,
    check_count,
    check_sizes,
)
from workbench.cache.prefix_cache import ROOT, HashFn, PrefixCache
from workbench.intmath import ceil_div

__all__ = ["BlockManager", "NoFreeBlocksError"]


class _SeqState(SequenceRecord):
    __slots__ = ("table", "num_registered")

    def __init__(self, tokens: list[int], table: list[int], num_computed: int, num_reserved: int,
                 num_registered: int):
        super().__init__(tokens, num_computed, num_reserved)
        self.table = table  # len(table) covers num_reserved
        self.num_registered = num_registered  # table[:num_registered] are all in the prefix cache


class BlockManager(BlockManagerBase):
    """Allocates KV blocks to sequences, shares them by reference count and caches full blocks by prefix."""

    __slots__ = ()

    def __init__(self, num_blocks: int, block_size: int = 16, *, enable_prefix_caching: bool = True,
                 hash_fn: HashFn | None = None):
        check_sizes(num_blocks=num_blocks, block_size=block_size)
        super().__init__(num_blocks, block_size, PrefixCache(block_size, hash_fn), enable_prefix_caching)

    # ---------------------------------------------------------------------------------- sequence lifecycle
    def add_sequence(self, seq_id: int, token_ids: Sequence[int], lookup: bool = True) -> int:
        """Register a sequence with its tokens and return how many leading tokens are already cached
        (a multiple of block_size, always < len(token_ids): the block holding the last token is computed so
        that the forward yields logits). Takes the hit blocks from the cache and allocates nothing else.
        The manager keeps a copy of the tokens; tell it about later ones with ``append_tokens``.
        ``lookup=False``: compute every token (a request that wants each prompt token's logits); its full blocks
        are still registered for others, and the skipped lookup is no prefix-cache query (as in vLLM)."""
        tokens = self._new_tokens(seq_id, token_ids)
        hits: list[int] = []
        if self.enable_prefix_caching and lookup:
            hits = self.prefix_cache.lookup(tokens, (len(tokens) - 1) // self.block_size)
            for block in hits:
                self._pool.acquire(block)
        num_hit = len(hits) * self.block_size
        self._seqs[seq_id] = _SeqState(tokens, hits, num_hit, num_hit, len(hits))
        if lookup:
            self._count_query(len(tokens), num_hit)
        return num_hit

    def blocks_to_reserve(self, seq_id: int, num_tokens: int) -> int:
        """Free blocks ``reserve(seq_id, num_tokens)`` would consume (new blocks plus copy-on-write copies)."""
        cow, new_blocks = self._reservation(self._get(seq_id), num_tokens)
        return len(cow) + new_blocks

    def reserve(self, seq_id: int, num_tokens: int) -> list[tuple[int, int]]:
        """Make sure slots exist for positions [0, num_tokens), allocating blocks on demand. If writes are
        coming (num_tokens > num_computed), every block from position num_computed on that is shared or cached
        is first replaced by a private one. Returns the (src, dst) block copies the runner must make before the
        forward, in list order across the step (a src may be the dst of a later pair) or in one gather-scatter.
        Raises NoFreeBlocksError, changing nothing, if there are not enough free blocks."""
        seq = self._get(seq_id)
        cow, new_blocks = self._reservation(seq, num_tokens)
        if len(cow) + new_blocks > self.num_free_blocks:
            raise NoFreeBlocksError(
                f"seq_id {seq_id!r} needs {len(cow) + new_blocks} blocks to reserve {num_tokens} tokens "
                f"({len(cow)} of them copy-on-write), but only {self.num_free_blocks} are free")
        replaced = [seq.table[index] for index in cow]
        for index in cow:
            seq.table[index] = self._pool.allocate()
        # Only the block holding position num_computed can still hold KV this sequence reads: copy that one.
        copies = [(old, seq.table[index]) for index, old in zip(cow, replaced, strict=True)
                  if index * self.block_size < seq.num_computed]
        seq.table.extend(self._pool.allocate() for _ in range(new_blocks))
        # Released only after allocating, so that this call cannot hand a copy source out again.
        for old in reversed(replaced):
            self._pool.release(old)
        seq.num_reserved = max(seq.num_reserved, num_tokens)
        return copies

    def mark_computed(self, seq_id: int, num_tokens: int) -> None:
        """The KV of the first num_tokens tokens is now in the cache (their tokens must be known and their
        slots reserved; a smaller num_tokens than already computed is a no-op). Full computed blocks are
        registered in the prefix cache. If another block already caches the same content, this sequence
        switches to it and frees its own copy (so the table entry of a full, computed block may change here).
        ValueError if a newly computed position lies in a shared or cached block: the KV was written without
        the reserve() that copies such blocks (needed after fork() or truncate())."""
        seq = self._get(seq_id)
        check_count("num_tokens", num_tokens, min(len(seq.tokens), seq.num_reserved))
        if num_tokens <= seq.num_computed:
            return
        size = self.block_size
        for block in seq.table[seq.num_computed // size:ceil_div(num_tokens, size)]:
            if self._ref[block] > 1 or block in self.prefix_cache:
                raise ValueError(f"seq_id {seq_id!r}: KV up to position {num_tokens} was written into block {block}, "
                                 "which is shared or cached; reserve() after fork() or truncate() and before writing")
        seq.num_computed = num_tokens
        if self.enable_prefix_caching:
            self._register_full_blocks(seq)

    def fork(self, parent_id: int, child_id: int, token_ids: Sequence[int] | None = None) -> None:
        """The child shares every block of the parent (reference count + 1). Its tokens are ``token_ids``
        (copied like add_sequence's), which must equal the parent's wherever the parent has computed KV; by
        default the parent's."""
        tokens = self._fork_tokens(parent_id, child_id, token_ids)
        parent = self._get(parent_id)
        for block in parent.table:
            self._pool.acquire(block)
        self._seqs[child_id] = _SeqState(tokens, list(parent.table), parent.num_computed, parent.num_reserved,
                                         parent.num_registered)

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Forget tokens, computed KV and slots beyond num_tokens (speculative-decoding rollback) and free the
        blocks no longer needed. Cached blocks stay cached; a kept block that is shared or cached is copied on
        the next reserve() that writes into it."""
        seq = self._get(seq_id)
        self._forget_past(seq, num_tokens)
        seq.num_registered = min(seq.num_registered, seq.num_computed // self.block_size)
        keep = ceil_div(seq.num_reserved, self.block_size)
        surplus = seq.table[keep:]
        del seq.table[keep:]
        for block in reversed(surplus):
            self._pool.release(block)

    def free(self, seq_id: int) -> None:
        """Release the sequence. Its cached blocks become evictable, deepest first, and can still be hit."""
        seq = self._get(seq_id)
        del self._seqs[seq_id]
        for block in reversed(seq.table):
            self._pool.release(block)

    # ---------------------------------------------------------------------------------------------- queries
    def block_table(self, seq_id: int) -> list[int]:
        return list(self._get(seq_id).table)

    def slot(self, seq_id: int, position: int) -> int:
        seq = self._get(seq_id)
        if not 0 <= position < seq.num_reserved:
            raise ValueError(f"position must be in [0, {seq.num_reserved}) for seq_id {seq_id!r} (its reserved "
                             f"slots), got {position}")
        block, offset = divmod(position, self.block_size)
        return seq.table[block] * self.block_size + offset

    def slots(self, seq_id: int, start: int, end: int) -> list[int]:
        """Slots of positions [start, end), all reserved."""
        seq = self._get(seq_id)
        if not 0 <= start <= end <= seq.num_reserved:
            raise ValueError(f"need 0 <= start <= end <= {seq.num_reserved} (reserved slots of seq_id "
                             f"{seq_id!r}), got start={start}, end={end}")
        out: list[int] = []
        size, position = self.block_size, start
        while position < end:
            index, offset = divmod(position, size)
            count = min(size - offset, end - position)
            base = seq.table[index] * size + offset
            out.extend(range(base, base + count))
            position += count
        return out

    def blocks_needed(self, token_ids_or_count: Sequence[int] | int) -> int:
        """How many of num_free_blocks admitting a new request would consume, so ``blocks_needed(prompt) <=
        num_free_blocks`` is the admission test. For a token list, cache hits on blocks already in use cost
        nothing; hits on evictable blocks still count, as taking them shrinks the free pool. Changes nothing."""
        if not hasattr(token_ids_or_count, "__len__"):
            check_count("token count", token_ids_or_count)
            return ceil_div(token_ids_or_count, self.block_size)
        tokens = token_ids_or_count
        needed = ceil_div(len(tokens), self.block_size)
        if self.enable_prefix_caching and len(tokens) > 1:
            hits = self.prefix_cache.lookup(tokens, (len(tokens) - 1) // self.block_size)
            needed -= sum(1 for block in hits if self._ref[block] > 0)
        return needed

    # ------------------------------------------------------------------------------------------- internals
    def _reservation(self, seq: _SeqState, num_tokens: int) -> tuple[list[int], int]:
        """Table indices to copy-on-write, and the number of new blocks, for reserve(num_tokens). Copies every
        shared or cached block from the first uncomputed position on, not just those below num_tokens: sparing
        one would leave a lookahead block shared by tables that differ before it."""
        check_count("num_tokens", num_tokens)
        table, cache = seq.table, self.prefix_cache
        new_blocks = max(0, ceil_div(num_tokens, self.block_size) - len(table))
        if num_tokens <= seq.num_computed:
            return [], new_blocks
        cow = [index for index in range(seq.num_computed // self.block_size, len(table))
               if self._ref[table[index]] > 1 or table[index] in cache]
        return cow, new_blocks

    def _register_full_blocks(self, seq: _SeqState) -> None:
        """Register the computed full blocks not yet cached, in chain order, stopping at a collision."""
        cache, table, size = self.prefix_cache, seq.table, self.block_size
        index = seq.num_registered
        while index < seq.num_computed // size:
            block = table[index]
            if block not in cache:  # (a fork sibling may have registered this very block already)
                parent = table[index - 1] if index else ROOT
                token_ids = tuple(seq.tokens[index * size:(index + 1) * size])
                block_hash, cached = cache.match(parent, token_ids)
                if cached is not None:
                    # Same content computed twice (e.g. two requests admitted together): keep the cached copy
                    # so that later blocks can chain onto it. Not for a block shared with fork siblings, whose
                    # tables must keep agreeing on every block before one they share.
                    if self._ref[block] > 1:
                        break
                    self._pool.acquire(cached)
                    table[index] = cached
                    self._pool.release(block)
                elif not cache.register(block, parent, token_ids, block_hash):
                    break  # the hash belongs to different content: a collision ends this sequence's chain
            index += 1
        seq.num_registered = index
