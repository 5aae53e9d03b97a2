"""The host-memory tier: a fixed pool of block-sized rows in RAM (pinned under a CUDA cache, so copies to and from
the GPU run by DMA at the bus's speed), with its own LRU.

Rows are allocated once at start-up, like the device's block pool: a tier of N GiB holds N GiB // bytes_per_block
blocks, and storing a new block into a full tier reuses the row of its least recently used one. A row a request
is about to restore is *pinned* until the copy has run, so that blocks spilled in the same step (whose copies run
first) cannot take it. Lost when the process exits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from workbench.cache.tier.codec import BlockCodec


class HostStore:
    kind = "host"
    medium = "CPU"

    def __init__(self, codec: BlockCodec, capacity_bytes: int):
        self.bytes_per_block = codec.bytes_per_block
        self.num_slots = capacity_bytes // self.bytes_per_block
        if self.num_slots < 1:
            raise ValueError(f"a host tier of {capacity_bytes:,} bytes cannot hold one block of "
                             f"{self.bytes_per_block:,} bytes: give it at least that much")
        self.rows = codec.empty_rows(self.num_slots, pin=codec.device.type == "cuda")
        self._index: OrderedDict[bytes, int] = OrderedDict()  # digest -> row; first = least recently used
        self._free = list(range(self.num_slots - 1, -1, -1))
        self._pinned: dict[int, int] = {}  # row -> restores waiting for it
        self.evicted_blocks = 0
        self.dropped_blocks = 0  # stores refused: every row pinned by a waiting restore
        self.degraded: str | None = None  # never: memory does not fill up behind the tier's back

    # ------------------------------------------------------------------------------------------------ index
    def __contains__(self, digest: bytes) -> bool:
        return digest in self._index

    def __len__(self) -> int:
        return len(self._index)

    @property
    def used_bytes(self) -> int:
        return len(self._index) * self.bytes_per_block

    @property
    def capacity_bytes(self) -> int:
        return self.num_slots * self.bytes_per_block

    def probe(self, digests: Sequence[bytes]) -> int:
        """How many of ``digests``, from the first, the tier holds."""
        count = 0
        for digest in digests:
            if digest not in self._index:
                break
            count += 1
        return count

    def reserve(self, digests: Sequence[bytes], tokens: Sequence[tuple[int, ...]]) -> list[int]:
        """Pin the rows of ``digests`` (all held: ``probe`` said so) for a restore and mark them recently used."""
        rows = []
        for digest in digests:
            row = self._index.get(digest)
            if row is None:
                break
            self._index.move_to_end(digest)
            self._pinned[row] = self._pinned.get(row, 0) + 1
            rows.append(row)
        return rows

    def discard(self, digests: Sequence[bytes]) -> None:
        for digest in digests:
            row = self._index.pop(digest, None)
            if row is not None:
                self._free.append(row)

    def clear(self) -> None:
        self.discard(list(self._index))

    # ------------------------------------------------------------------------------------------------ bytes
    def save(self, codec: BlockCodec, entries: Sequence[tuple[int, bytes, tuple[int, ...]]]) -> int:
        """Store ``(block, digest, tokens)`` entries not held yet (held ones become most recently used); returns
        the blocks copied."""
        blocks, rows = [], []
        for block, digest, _ in entries:
            if digest in self._index:
                self._index.move_to_end(digest)
                continue
            row = self._take_row()
            if row is None:
                self.dropped_blocks += 1
                continue
            self._index[digest] = row
            blocks.append(block)
            rows.append(row)
        codec.pack(blocks, self.rows, rows)
        return len(blocks)

    def load(self, codec: BlockCodec, handles: Sequence[int], blocks: Sequence[int]) -> None:
        """Copy the reserved rows into ``blocks`` of the cache and unpin them."""
        try:
            codec.unpack(self.rows, handles, blocks)
        finally:
            self.release(handles)

    def release(self, handles: Sequence[int]) -> None:
        for row in handles:
            left = self._pinned.get(row, 0) - 1
            if left > 0:
                self._pinned[row] = left
            else:
                self._pinned.pop(row, None)

    def _take_row(self) -> int | None:
        if self._free:
            return self._free.pop()
        for digest, row in self._index.items():  # least recently used first
            if row not in self._pinned:
                del self._index[digest]
                self.evicted_blocks += 1
                return row
        return None
