"""The second KV tier as the engine holds it: a store (host memory or disk), the codec that moves blocks between
it and the device cache, the restore rule measured at start-up, and the counters the metrics export.

    engine = LLMEngine(model, tokenizer, kv_offload=KVOffloadConfig("disk", size_gib=2, directory="kv"))

The engine calls ``move(blocks)`` before each forward (spills and stores first, then restores: see
`workbench.cache.tier.manager`) and after each step's bookkeeping (write-through stores), and ``flush(blocks)`` at
a clean shutdown (write-back: every cached block the tier lacks). Transfers are timed, with the device
synchronized, so the byte and second counters read as bandwidths.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from dataclasses import dataclass, field

from workbench.cache.tier.codec import BlockCodec
from workbench.cache.tier.config import KVOffloadConfig
from workbench.cache.tier.disk_store import DiskStore
from workbench.cache.tier.host_store import HostStore
from workbench.cache.tier.keys import Fingerprint, fingerprint
from workbench.cache.tier.rule import RestoreRule, TransferCost, time_transfers


class TierUnavailable(RuntimeError):
    """The tier cannot store or give back blocks (why: the message); the engine goes on without it."""


CALIBRATION_BLOCKS = 8
SIZES_KEPT = 4096  # blocks per timed transfer at start-up (and 1): the slope and the fixed part


@dataclass(slots=True)
class TierCounters:
    """Since start-up: lookups in blocks (after a device miss), what the rule did with them, and the transfers."""

    looked_up_blocks: int = 0  # blocks a prompt could have taken from the tier after its device hits
    available_blocks: int = 0  # of those, held by the tier
    restored_blocks: int = 0
    declined_blocks: int = 0  # held, but the rule chose to recompute them
    stored_blocks: int = 0  # written to the tier (spills and write-through stores)
    store_bytes: int = 0
    restore_bytes: int = 0
    store_seconds: float = 0.0
    restore_seconds: float = 0.0
    store_ops: int = 0
    restore_ops: int = 0
    # ("store"/"restore", bytes) of each transfer the metrics have not read yet; the newest few thousand only, so an
    # engine that nobody scrapes does not grow it for ever
    transfer_sizes: deque[tuple[str, int]] = field(default_factory=lambda: deque(maxlen=SIZES_KEPT))


class KVTier:
    """One engine's second tier. ``root`` (the fingerprint's digest) roots every block name; ``rule`` decides
    restore or recompute (restore always until ``calibrate`` has the measured costs)."""

    def __init__(self, config: KVOffloadConfig, codec: BlockCodec, store: HostStore | DiskStore,
                 stamp: Fingerprint, block_size: int):
        self.config, self.codec, self.store = config, codec, store
        self.fingerprint, self.root = stamp, stamp.digest
        self.block_size = block_size
        self.write_through = config.write_policy == "write_through"
        self.rule = RestoreRule(None, None, None, block_size, mode="always" if config.restore == "auto"
                                else config.restore)  # until calibrate() measures the costs
        self.counters = TierCounters()
        self.device_medium = "GPU" if codec.device.type == "cuda" else "CPU"
        self._reserve_s = 0.0  # reading a disk tier's files happens at admission: counted with the restore

    @classmethod
    def build(cls, config: KVOffloadConfig, model, cache) -> KVTier:
        codec = BlockCodec(cache)
        stamp = fingerprint(model, cache, codec.bytes_per_block)
        if config.kind == "host":
            store: HostStore | DiskStore = HostStore(codec, config.size_bytes)
        else:
            store = DiskStore(codec, config.size_bytes, config.directory, stamp)
        return cls(config, codec, store, stamp, cache.block_size)

    # ------------------------------------------------------------------------------------------- counting
    def note_lookup(self, looked_up: int, available: int, restoring: int) -> None:
        c = self.counters
        c.looked_up_blocks += looked_up
        c.available_blocks += available
        c.declined_blocks += available - restoring

    def note_restored(self, blocks: int) -> None:
        self.counters.restored_blocks += blocks

    def reserve(self, names: list[bytes], tokens: list[tuple[int, ...]]) -> list:
        """The store's handles for restoring ``names`` (a disk tier reads and checks the files here)."""
        start = time.perf_counter()
        handles = self.store.reserve(names, tokens)
        self._reserve_s += time.perf_counter() - start
        return handles

    @property
    def transfer_types(self) -> dict[str, str]:
        """vLLM's transfer_type labels: the medium a copy leaves, then the one it reaches."""
        return {"store": f"{self.device_medium}_to_{self.store.medium}",
                "restore": f"{self.store.medium}_to_{self.device_medium}"}

    # ------------------------------------------------------------------------------------------ transfers
    def move(self, blocks) -> None:
        """Run what ``blocks`` (a TieredBlockManager) queued: spills and stores, then restores."""
        spills, restores = blocks.take()
        if spills:
            self._store(spills)
        if restores:
            self._restore([h for h, _ in restores], [b for _, b in restores])
        else:  # lookups whose reads all failed restore nothing: their time is not a restore's
            self._reserve_s = 0.0

    def _store(self, entries) -> None:
        start = time.perf_counter()
        written = self.store.save(self.codec, entries)
        self.codec.synchronize()
        self._count("store", written, time.perf_counter() - start)

    def _restore(self, handles, targets) -> None:
        start = time.perf_counter()
        self.store.load(self.codec, handles, targets)
        self.codec.synchronize()
        seconds, self._reserve_s = time.perf_counter() - start + self._reserve_s, 0.0
        self._count("restore", len(targets), seconds)

    def _count(self, kind: str, count: int, seconds: float) -> None:
        if not count:
            return
        c, size = self.counters, count * self.codec.bytes_per_block
        if kind == "store":
            c.stored_blocks += count
            c.store_bytes += size
            c.store_seconds += seconds
            c.store_ops += 1
        else:
            c.restore_bytes += size
            c.restore_seconds += seconds
            c.restore_ops += 1
        c.transfer_sizes.append((kind, size))

    def flush(self, blocks) -> None:
        """Write back every cached block the tier lacks (a clean shutdown under write-back; harmless otherwise)."""
        blocks.queue_all()
        self.move(blocks)

    def take_transfer_sizes(self) -> list[tuple[str, int]]:
        sizes = list(self.counters.transfer_sizes)
        self.counters.transfer_sizes.clear()
        return sizes

    # ---------------------------------------------------------------------------------------- calibration
    def measure_transfers(self, scratch_blocks: list[int], *, cold: bool = True,
                          repeats: int = 2) -> tuple[TransferCost, TransferCost]:
        """Store and restore real blocks of the cache through the store under scratch names; the fastest of
        ``repeats``. ``cold``: a disk tier's files are synced and dropped from the page cache before they are read
        (what a restarted machine reads); otherwise they are read from the page cache (just written)."""
        def store_fn(blocks: list[int], names: list[bytes]) -> None:
            self.store.save(self.codec, [(b, n, (0,) * self.block_size) for b, n in zip(blocks, names, strict=True)])
            self.codec.synchronize()
            if cold and isinstance(self.store, DiskStore):
                _drop_from_page_cache([self.store.path_of(n) for n in names])

        def restore_fn(blocks: list[int], names: list[bytes]) -> None:
            if self.store.degraded is not None:
                raise TierUnavailable(self.store.degraded)
            handles = self.store.reserve(names, [(0,) * self.block_size] * len(names))
            if len(handles) != len(names):
                raise TierUnavailable(f"the {self.config.kind} tier lost blocks it had just stored")
            self.store.load(self.codec, handles, blocks)
            self.codec.synchronize()

        count = min(CALIBRATION_BLOCKS, len(scratch_blocks))
        return time_transfers(store_fn, restore_fn, self.store.discard, scratch_blocks[:count],
                              self.codec.bytes_per_block, repeats)

    def calibrate(self, store_cost: TransferCost, restore_cost: TransferCost, prefill_s_per_token: float) -> None:
        self.rule = RestoreRule(restore_cost, store_cost, prefill_s_per_token, self.block_size,
                                mode=self.config.restore)

    def switch_off(self) -> None:
        """No restores from now on (a tier that could not store its start-up measurement: a full disk)."""
        self.rule = RestoreRule(None, None, None, self.block_size, mode="never")

    def describe(self) -> str:
        s = self.store
        return (f"{self.config.kind} tier of {self.config.size_gib:g} GiB ({s.capacity_bytes // s.bytes_per_block:,} "
                f"blocks of {s.bytes_per_block:,} bytes), {self.config.write_policy}; {self.rule.describe()}")


def _drop_from_page_cache(paths) -> None:
    for path in paths:
        with contextlib.suppress(OSError), open(path, "rb") as file:
            os.fsync(file.fileno())
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
