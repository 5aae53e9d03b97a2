"""Block tables per KV group over one shared pool: the block manager for models that mix full-attention and
sliding-window layers (Gemma 3, gpt-oss, Mistral's window, a window imposed on SmolLM2).

Each group of layers (`workbench.cache.kv_groups`) keeps its own block table per sequence, indexed by logical
block like the single-group manager's (`workbench.cache.block_manager`), and every table draws from one pool of
equal blocks. What differs is the sliding groups:

- **freeing**: before a sequence computes tokens from position ``p`` on, its queries can no longer see keys before
  ``p - window + 1``; a sliding group's blocks that lie wholly before that are released (and become evictable if
  cached) and their table entries become holes. The attention kernels never read a hole: they only read keys
  inside the window (`workbench_kernels` ``window=``);
- **prefix hits** need only the last window of tokens in a sliding group (`workbench.cache.grouped_prefix_cache`);
- **admission** counts what each group really holds at most: a full group the whole sequence, a sliding group the
  window behind a prefill chunk (`kv_groups.group_blocks_needed`).

The public methods mirror `BlockManager`'s, so the scheduler, the bookkeeper and the batch builder drive both
alike; ``block_table``/``slots`` answer for one group (group 0 by default) and hand the kernels a hole as block 0,
which they never read. The CPU side only: integers, no tensors.
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
from workbench.cache.grouped_prefix_cache import GroupedPrefixCache
from workbench.cache.kv_groups import KVGroupLayout, first_needed_position, group_blocks_needed
from workbench.cache.prefix_cache import ROOT
from workbench.intmath import ceil_div

HOLE = -1  # a table entry whose block a sliding group has let go of


class _Seq(SequenceRecord):
    __slots__ = ("tables", "nodes", "registered")

    def __init__(self, tokens: list[int], tables: list[list[int]], nodes: list[int], num_computed: int):
        super().__init__(tokens, num_computed, num_computed)
        self.tables = tables  # one per group, HOLE where a sliding group freed the block
        self.nodes = nodes  # trie nodes of the full computed blocks (this sequence holds a reference on each)
        self.registered = len(nodes)  # blocks [0, registered) went through registration


class HybridBlockManager(BlockManagerBase):
    """Allocates each KV group's blocks from one shared pool, freeing what leaves a window."""

    __slots__ = ("layout", "max_chunk", "num_slid_blocks")

    def __init__(self, num_blocks: int, block_size: int, layout: KVGroupLayout, *,
                 enable_prefix_caching: bool = True, max_chunk: int = 512):
        check_sizes(num_blocks=num_blocks, block_size=block_size, max_chunk=max_chunk)
        super().__init__(num_blocks, block_size, GroupedPrefixCache(layout.groups, block_size), enable_prefix_caching)
        self.layout = layout
        self.max_chunk = max_chunk  # tokens a sequence computes in one step at most (the admission estimate)
        self.num_slid_blocks = 0  # blocks let go of because they left a window (a counter for the lab)

    @property
    def num_groups(self) -> int:
        return len(self.layout.groups)

    # ---------------------------------------------------------------------------------- sequence lifecycle
    def add_sequence(self, seq_id: int, token_ids: Sequence[int], lookup: bool = True) -> int:
        """Register a sequence (a copy of its tokens is kept) and return how many leading tokens are already
        cached: whole blocks, always fewer than all of them, each group holding what it needs.
        ``lookup=False``: compute every token (`BlockManager.add_sequence`)."""
        token_ids = self._new_tokens(seq_id, token_ids)
        nodes = (self.prefix_cache.lookup(token_ids, (len(token_ids) - 1) // self.block_size)
                 if self._caching and lookup else [])
        hit = len(nodes)
        tables = []
        for g in range(self.num_groups):
            table = [HOLE] * hit
            for index in self.prefix_cache.needed_range(g, hit):
                table[index] = self.prefix_cache.block(g, nodes[index])
                self._pool.acquire(table[index])
            tables.append(table)
        for node in nodes:
            self.prefix_cache.trie.hold(node)
        self._seqs[seq_id] = _Seq(token_ids, tables, nodes, hit * self.block_size)
        if lookup:
            self._count_query(len(token_ids), hit * self.block_size)
        return hit * self.block_size

    def blocks_to_reserve(self, seq_id: int, num_tokens: int) -> int:
        """Free blocks ``reserve`` would consume, net of what leaving the windows gives back."""
        seq = self._get(seq_id)
        taken = sum(len(cow) + new for cow, new in self._reservation(seq, num_tokens))
        returned = sum(1 for g, index in self._slid_out(seq) if self._ref[seq.tables[g][index]] == 1)
        return taken - returned

    def reserve(self, seq_id: int, num_tokens: int) -> list[tuple[int, int]]:
        """Slots for positions [0, num_tokens) in every group: blocks that left a window are released first,
        then new blocks and copy-on-write copies are taken (see `BlockManager.reserve`). Raises
        NoFreeBlocksError, changing nothing, when the pool is short."""
        seq = self._get(seq_id)
        needed = self.blocks_to_reserve(seq_id, num_tokens)
        if needed > self.num_free_blocks:
            raise NoFreeBlocksError(f"seq_id {seq_id!r} needs {needed} blocks to reserve {num_tokens} tokens over "
                                    f"{self.num_groups} KV groups, but only {self.num_free_blocks} are free")
        for g, index in self._slid_out(seq):
            self._pool.release(seq.tables[g][index])
            seq.tables[g][index] = HOLE
            self.num_slid_blocks += 1
        copies = []
        for table, (cow, new) in zip(seq.tables, self._reservation(seq, num_tokens), strict=True):
            replaced = [table[index] for index in cow]
            for index in cow:
                table[index] = self._pool.allocate()
            copies += [(old, table[index]) for index, old in zip(cow, replaced, strict=True)
                       if index * self.block_size < seq.num_computed]
            table.extend(self._pool.allocate() for _ in range(new))
            for old in reversed(replaced):
                self._pool.release(old)
        seq.num_reserved = max(seq.num_reserved, num_tokens)
        return copies

    def mark_computed(self, seq_id: int, num_tokens: int) -> None:
        """The KV of the first ``num_tokens`` tokens is in every group's blocks; full blocks get registered."""
        seq = self._get(seq_id)
        check_count("num_tokens", num_tokens, min(len(seq.tokens), seq.num_reserved))
        if num_tokens <= seq.num_computed:
            return
        size = self.block_size
        for table in seq.tables:
            for block in table[seq.num_computed // size:ceil_div(num_tokens, size)]:
                if block != HOLE and (self._ref[block] > 1 or block in self.prefix_cache):
                    raise ValueError(f"seq_id {seq_id!r}: KV up to position {num_tokens} was written into block "
                                     f"{block}, which is shared or cached; reserve() before writing")
        seq.num_computed = num_tokens
        if self._caching:
            self._register(seq)

    def fork(self, parent_id: int, child_id: int, token_ids: Sequence[int] | None = None) -> None:
        """The child shares every block of the parent in every group (see `BlockManager.fork`)."""
        token_ids = self._fork_tokens(parent_id, child_id, token_ids)
        parent = self._get(parent_id)
        for table in parent.tables:
            for block in table:
                if block != HOLE:
                    self._pool.acquire(block)
        for node in parent.nodes:
            self.prefix_cache.trie.hold(node)
        child = _Seq(token_ids, [list(t) for t in parent.tables], list(parent.nodes), parent.num_computed)
        child.num_reserved, child.registered = parent.num_reserved, parent.registered
        self._seqs[child_id] = child

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Forget tokens, KV and slots past ``num_tokens`` (blocks left of a window stay let go of)."""
        seq = self._get(seq_id)
        self._forget_past(seq, num_tokens)
        keep_nodes = seq.num_computed // self.block_size
        for node in seq.nodes[keep_nodes:]:
            self.prefix_cache.trie.drop(node)
        del seq.nodes[keep_nodes:]
        seq.registered = min(seq.registered, keep_nodes)
        keep = ceil_div(seq.num_reserved, self.block_size)
        for table in seq.tables:
            for block in reversed(table[keep:]):
                if block != HOLE:
                    self._pool.release(block)
            del table[keep:]

    def free(self, seq_id: int) -> None:
        """Release the sequence; its cached blocks become evictable, deepest first in each group."""
        seq = self._get(seq_id)
        del self._seqs[seq_id]
        for table in seq.tables:
            for block in reversed(table):
                if block != HOLE:
                    self._pool.release(block)
        for node in seq.nodes:
            self.prefix_cache.trie.drop(node)

    # ---------------------------------------------------------------------------------------------- queries
    def group_table(self, seq_id: int, group: int) -> list[int]:
        """One group's table as it is, ``HOLE`` (-1) where a window let the block go."""
        return list(self._get(seq_id).tables[group])

    def block_table(self, seq_id: int, group: int = 0) -> list[int]:
        """One group's table for the kernels: holes read as block 0, which a window never lets them read."""
        return [0 if b == HOLE else b for b in self._get(seq_id).tables[group]]

    def slot(self, seq_id: int, position: int, group: int = 0) -> int:
        return self.slots(seq_id, position, position + 1, group)[0]

    def slots(self, seq_id: int, start: int, end: int, group: int = 0) -> list[int]:
        """Slots of positions [start, end) in one group (reserved, and inside its window)."""
        seq = self._get(seq_id)
        if not 0 <= start <= end <= seq.num_reserved:
            raise ValueError(f"need 0 <= start <= end <= {seq.num_reserved} (reserved slots of seq_id "
                             f"{seq_id!r}), got start={start}, end={end}")
        table, size, out, position = seq.tables[group], self.block_size, [], start
        while position < end:  # one run of slots per block
            index, offset = divmod(position, size)
            if table[index] == HOLE:
                raise ValueError(f"position {position} of seq_id {seq_id!r} left group {group}'s window")
            count = min(size - offset, end - position)
            base = table[index] * size + offset
            out.extend(range(base, base + count))
            position += count
        return out

    def blocks_needed(self, token_ids_or_count: Sequence[int] | int) -> int:
        """Free blocks admitting a sequence this long may take at most, all groups together (cache hits on blocks
        in use cost nothing): the scheduler's admission test, with each group's real demand."""
        tokens = token_ids_or_count if hasattr(token_ids_or_count, "__len__") else None
        count = len(tokens) if tokens is not None else token_ids_or_count
        check_count("token count", count)
        needed = self.layout.blocks_needed(count, self.block_size, self.max_chunk)
        if tokens is not None and self._caching and count > 1:
            nodes = self.prefix_cache.lookup(tokens, (count - 1) // self.block_size)
            for g in range(self.num_groups):
                in_use = [self.prefix_cache.block(g, nodes[i]) for i in self.prefix_cache.needed_range(g, len(nodes))]
                needed -= sum(1 for block in in_use if self._ref[block] > 0)
        return needed

    def group_demand(self, num_tokens: int) -> list[int]:
        """Each group's most blocks for a sequence of ``num_tokens`` tokens (the lab's per-group view)."""
        return [group_blocks_needed(g.window, num_tokens, self.block_size, self.max_chunk)
                for g in self.layout.groups]

    # ------------------------------------------------------------------------------------------- internals
    def _slid_out(self, seq: _Seq) -> list[tuple[int, int]]:
        """(group, index) of the blocks no query of this sequence can see any more: wholly before the window of
        its next computed position."""
        out = []
        for g, group in enumerate(self.layout.groups):
            first = first_needed_position(group.window, seq.num_computed) // self.block_size
            out += [(g, i) for i in range(min(first, len(seq.tables[g]))) if seq.tables[g][i] != HOLE]
        return out

    def _reservation(self, seq: _Seq, num_tokens: int) -> list[tuple[list[int], int]]:
        """Per group: table indices to copy-on-write and the number of new blocks (see `BlockManager`)."""
        check_count("num_tokens", num_tokens)
        out = []
        for table in seq.tables:
            new = max(0, ceil_div(num_tokens, self.block_size) - len(table))
            cow = [] if num_tokens <= seq.num_computed else [
                i for i in range(seq.num_computed // self.block_size, len(table))
                if table[i] != HOLE and (self._ref[table[i]] > 1 or table[i] in self.prefix_cache)]
            out.append((cow, new))
        return out

    def _register(self, seq: _Seq) -> None:
        """Give each newly full computed block its trie node and register every group's copy of it; where a
        group already caches that node, switch to the cached block (unless fork siblings share this one)."""
        size, trie = self.block_size, self.prefix_cache.trie
        for index in range(seq.registered, seq.num_computed // size):
            if index >= len(seq.nodes):
                parent = seq.nodes[index - 1] if index else ROOT
                seq.nodes.append(trie.child(parent, tuple(seq.tokens[index * size:(index + 1) * size])))
            node = seq.nodes[index]
            for g, table in enumerate(seq.tables):
                block = table[index]
                if block == HOLE or block in self.prefix_cache:
                    continue
                cached = self.prefix_cache.block(g, node)
                if cached is None:
                    self.prefix_cache.register(g, node, block)
                elif self._ref[block] == 1:  # the same content twice: keep the cached copy
                    self._pool.acquire(cached)
                    table[index] = cached
                    self._pool.release(block)
        seq.registered = max(seq.registered, seq.num_computed // size)
