"""The block manager with a second tier under its prefix cache: evicted blocks spill to the tier, and a prompt whose
prefix misses the device's cache but hits the tier gets those blocks restored instead of recomputed.

It is the ordinary `workbench.cache.block_manager.BlockManager` plus three hooks, all on the CPU side (integers and
names, never a tensor):

- eviction: the prefix cache calls back with the block it is about to evict, while the block's chain of parents is
  still registered, so its tier name (`workbench.cache.tier.keys`) can be computed; the block is queued to be
  *spilled* (its bytes are still in the device cache until the next forward overwrites them);
- admission: after the device lookup, the blocks that follow are looked up in the tier; the restore rule
  (`workbench.cache.tier.rule`) says whether to restore them; restored blocks are allocated, registered in the
  prefix cache (so other requests hit them like any cached block) and queued to be *restored*; the sequence
  starts with them computed;
- with ``write_through``, every full block registered after a forward is queued to be *stored* at once.

The engine runs the queue (`workbench.cache.tier.tier.KVTier.move`) before each forward, spills and stores first
(a spilled block's device copy may be the very block a restore is about to overwrite), then restores.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from workbench.cache.block_manager import BlockManager
from workbench.cache.prefix_cache import ROOT, CachedBlock, HashFn, PrefixCache
from workbench.cache.tier.keys import block_digests, chain

RESTORED_KEPT = 4096  # sequences whose restored-token count is kept for the metrics exporter to read


class SpillingPrefixCache(PrefixCache):
    """The prefix cache, telling ``on_evict(block, entry)`` about a block just before it is evicted."""

    __slots__ = ("on_evict",)

    def __init__(self, block_size: int, hash_fn: HashFn | None = None):
        super().__init__(block_size, hash_fn)
        self.on_evict = None

    def evict(self) -> int:
        block = next(iter(self._evictable))
        if self.on_evict is not None:
            self.on_evict(block, self._entries[block])
        return super().evict()


class TieredBlockManager(BlockManager):
    """``tier``: a `workbench.cache.tier.tier.KVTier` (its store's index, its rule, its name root)."""

    __slots__ = ("tier", "spills", "restores", "_names", "_restored", "enabled")

    def __init__(self, num_blocks: int, block_size: int, tier, *, enable_prefix_caching: bool = True,
                 hash_fn: HashFn | None = None):
        if not enable_prefix_caching:
            raise ValueError("a second KV tier keeps what the prefix cache evicts: turn prefix caching on")
        super().__init__(num_blocks, block_size, enable_prefix_caching=True, hash_fn=hash_fn)
        cache = SpillingPrefixCache(block_size, hash_fn)
        cache.on_evict = self._spill
        self._use_cache(cache)
        self.tier = tier
        self.spills: list[tuple[int, bytes, tuple[int, ...]]] = []  # (block, name, tokens) to copy out
        self.restores: list[tuple[object, int]] = []  # (the store's handle, block) to copy in
        self._names: dict[int, tuple[CachedBlock, bytes]] = {}  # block -> (its entry when named, its name)
        self._restored: OrderedDict[int, int] = OrderedDict()  # seq_id -> tokens restored at its last admission
        self.enabled = True  # off while the engine calibrates, so its scratch prompts leave nothing behind

    # ------------------------------------------------------------------------------------------------ names
    def _name(self, block: int) -> bytes | None:
        """The tier name of a registered block, from its chain of registered parents (memoized per entry)."""
        cache, path = self.prefix_cache, []
        name = bytes.fromhex(self.tier.root)
        current = block
        while current != ROOT:
            entry = cache.entry(current)
            if entry is None:
                return None
            known = self._names.get(current)
            if known is not None and known[0] is entry:
                name = known[1]
                break
            path.append((current, entry))
            current = entry.parent
        for node, entry in reversed(path):
            name = chain(name, entry.token_ids)
            self._names[node] = (entry, name)
        return name

    def _spill(self, block: int, entry: CachedBlock) -> None:
        if not self.enabled:
            return
        name = self._name(block)
        if name is not None and name not in self.tier.store:
            self.spills.append((block, name, entry.token_ids))

    # --------------------------------------------------------------------------------------------- admission
    def add_sequence(self, seq_id: int, token_ids: Sequence[int], lookup: bool = True) -> int:
        num_hit = super().add_sequence(seq_id, token_ids, lookup)
        restored = self._restore(seq_id, token_ids, num_hit) if lookup and self.enabled else 0
        self._restored[seq_id] = restored
        self._restored.move_to_end(seq_id)
        while len(self._restored) > RESTORED_KEPT:
            self._restored.popitem(last=False)
        return num_hit + restored

    def _restore(self, seq_id: int, token_ids: Sequence[int], num_hit: int) -> int:
        size = self.block_size
        first, limit = num_hit // size, (len(token_ids) - 1) // size
        if first >= limit:
            return 0
        names = block_digests(self.tier.root, token_ids, size, limit)[first:]
        available = self.tier.store.probe(names)
        wanted = min(self.tier.rule.blocks_to_restore(available), self.num_free_blocks)
        self.tier.note_lookup(limit - first, available, wanted)
        if not wanted:
            return 0
        tokens = [tuple(token_ids[i * size:(i + 1) * size]) for i in range(first, first + wanted)]
        handles = self.tier.reserve(names[:wanted], tokens)
        seq = self._seqs[seq_id]
        cache = self.prefix_cache
        for i, handle in enumerate(handles):
            parent = seq.table[-1] if seq.table else ROOT
            block_hash, cached = cache.match(parent, tokens[i])
            block = self._pool.allocate()
            if cached is not None or not cache.register(block, parent, tokens[i], block_hash):
                self._pool.release(block)  # (cannot happen after a device miss; stop the chain if it does)
                self.tier.store.release(handles[i:])
                handles = handles[:i]
                break
            self._names[block] = (cache.entry(block), names[i])
            seq.table.append(block)
            self.restores.append((handle, block))
        count = len(handles) * size
        seq.num_computed = seq.num_reserved = num_hit + count
        seq.num_registered = len(seq.table)
        self.tier.note_restored(len(handles))
        return count

    def restored_tokens(self, seq_id: int) -> int:
        """Prompt tokens the sequence's last admission restored from the tier (0 if unknown)."""
        return self._restored.get(seq_id, 0)

    # ------------------------------------------------------------------------------------------ write-through
    def mark_computed(self, seq_id: int, num_tokens: int) -> None:
        seq = self._get(seq_id)
        before = seq.num_registered
        super().mark_computed(seq_id, num_tokens)
        if self.tier.write_through and self.enabled:
            self._queue_stores(seq.table[before:seq.num_registered])

    def _queue_stores(self, blocks: list[int]) -> None:
        for block in blocks:
            name = self._name(block)
            entry = self.prefix_cache.entry(block)
            if name is not None and name not in self.tier.store:
                self.spills.append((block, name, entry.token_ids))

    def cached_blocks(self) -> list[int]:
        """Every block registered in the prefix cache, in use or evictable (what a clean shutdown writes back)."""
        return [block for block, _ in self.prefix_cache.items()]

    def queue_all(self) -> None:
        """Queue every cached block that the tier does not hold yet (write-back at a clean shutdown)."""
        self._queue_stores(self.cached_blocks())

    def take(self) -> tuple[list[tuple[int, bytes, tuple[int, ...]]], list[tuple[object, int]]]:
        spills, restores = self.spills, self.restores
        self.spills, self.restores = [], []
        return spills, restores
