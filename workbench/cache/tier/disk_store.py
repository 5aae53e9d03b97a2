"""The disk tier: one file per KV block under ``<directory>/kv-<fingerprint>/``, with its own byte budget and LRU,
that a restarted server (or a second server on the same directory) finds again.

What makes it safe to share and to restart:

- a file is written under a temporary name and renamed into place (``os.replace`` is atomic on POSIX), so a
  reader sees a whole file or none, and two servers writing the same block leave one whole copy;
- every read checks the header and checksum (`workbench.cache.tier.file_format`): a truncated, foreign or corrupt
  file is skipped with a warning, never loaded, and the request computes that block instead;
- a file another server evicted between a lookup and the read is a miss, not an error;
- a write that fails (disk full, quota, a file-size limit, a read-only file system) turns the tier's writes off with
  one warning: requests go on as if there were no tier, and blocks already on disk are still read.

The budget is this server's: it counts the files present at start-up and those it writes or finds, and evicts the
least recently used (by file modification time across restarts; reads refresh it). Temporary files left by a
crashed writer are removed once they are ten minutes old.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import torch

from workbench.cache.tier.codec import BlockCodec
from workbench.cache.tier.file_format import BadBlockFile, decode, encode
from workbench.cache.tier.keys import Fingerprint

log = logging.getLogger("workbench.kv_offload")
SUFFIX = ".kvb"
STALE_TEMP_S = 600.0
PACK_BATCH = 64  # blocks packed per host buffer while storing (a flush can hold thousands)


class DiskStore:
    kind = "disk"
    medium = "DISK"

    def __init__(self, codec: BlockCodec, capacity_bytes: int, directory: Path, fingerprint: Fingerprint):
        self.bytes_per_block = codec.bytes_per_block
        if capacity_bytes < self.bytes_per_block:
            raise ValueError(f"a disk tier of {capacity_bytes:,} bytes cannot hold one block of "
                             f"{self.bytes_per_block:,} bytes: give it at least that much")
        self.capacity_bytes = capacity_bytes
        self.fields, self.fingerprint = fingerprint.header_fields(), fingerprint.digest
        self.root = Path(directory) / f"kv-{fingerprint.short}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(f"cannot use {directory} for the disk tier: {error.strerror}") from None
        self._index: OrderedDict[bytes, int] = OrderedDict()  # digest -> file bytes; first = least recently used
        self.used_bytes = 0
        self.evicted_blocks = self.dropped_blocks = self.found_blocks = 0
        self.skipped: dict[str, int] = {}  # why files were refused ("foreign", "corrupt", "truncated", ...)
        self.degraded: str | None = None  # why writes stopped, once they have
        self._scan()

    def path_of(self, digest: bytes) -> Path:
        """The file that holds (or would hold) the block named ``digest``."""
        return self.root / (digest.hex() + SUFFIX)

    def _scan(self) -> None:
        found, now = [], time.time()
        for entry in os.scandir(self.root):
            name = entry.name
            with contextlib.suppress(OSError):
                if name.startswith(".") and name.endswith(".tmp"):
                    if now - entry.stat().st_mtime > STALE_TEMP_S:
                        os.unlink(entry.path)
                elif name.endswith(SUFFIX) and len(name) == 64 + len(SUFFIX):
                    stat = entry.stat()
                    found.append((stat.st_mtime, bytes.fromhex(name[:64]), stat.st_size))
        for _, digest, size in sorted(found):
            self._index[digest] = size
            self.used_bytes += size
        self._make_room(0)

    # ------------------------------------------------------------------------------------------------ index
    def __contains__(self, digest: bytes) -> bool:
        return digest in self._index

    def __len__(self) -> int:
        return len(self._index)

    def probe(self, digests: Sequence[bytes]) -> int:
        """How many of ``digests``, from the first, have a file (written here, earlier, or by another server)."""
        count = 0
        for digest in digests:
            if digest not in self._index and not self._adopt(digest):
                break
            count += 1
        return count

    def _adopt(self, digest: bytes) -> bool:
        try:
            size = self.path_of(digest).stat().st_size
        except OSError:
            return False
        self._index[digest] = size
        self.used_bytes += size
        self.found_blocks += 1
        return True

    def reserve(self, digests: Sequence[bytes], tokens: Sequence[tuple[int, ...]]) -> list[memoryview]:
        """Read and check the files of ``digests``, from the first, stopping at the first that cannot be used;
        returns their payloads (the restore copies them into the cache later in the same step)."""
        payloads = []
        for digest, block_tokens in zip(digests, tokens, strict=True):
            path = self.path_of(digest)
            try:
                with open(path, "rb") as file:
                    data = bytearray(os.fstat(file.fileno()).st_size)
                    file.readinto(data)
                payloads.append(decode(data, fingerprint=self.fingerprint, digest=digest, tokens=block_tokens))
            except FileNotFoundError:  # evicted by another server since the lookup: a miss
                self._forget(digest)
                break
            except (OSError, BadBlockFile) as error:
                self._skip(path, error)
                self._forget(digest)
                break
            if digest in self._index:
                self._index.move_to_end(digest)
            else:  # written by another server since our lookup, or forgotten by our budget: count it again
                self._index[digest] = len(data)
                self.used_bytes += len(data)
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used, for the next server's LRU too
        return payloads

    def _skip(self, path: Path, error: Exception) -> None:
        reason = str(error).split(":")[0] if isinstance(error, BadBlockFile) else "unreadable"
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        log.warning("skipped KV block file %s: %s", path, error)

    def _forget(self, digest: bytes) -> None:
        size = self._index.pop(digest, None)
        if size is not None:
            self.used_bytes -= size

    def discard(self, digests: Sequence[bytes]) -> None:
        for digest in digests:
            if digest in self._index:
                self._forget(digest)
                with contextlib.suppress(OSError):
                    self.path_of(digest).unlink()

    def clear(self) -> None:
        self.discard(list(self._index))

    # ------------------------------------------------------------------------------------------------ bytes
    def save(self, codec: BlockCodec, entries: Sequence[tuple[int, bytes, tuple[int, ...]]]) -> int:
        """Write a file for each ``(block, digest, tokens)`` entry that has none; returns the blocks written."""
        new = []
        for entry in entries:
            if entry[1] in self._index or self._adopt(entry[1]):
                self._index.move_to_end(entry[1])
            else:
                new.append(entry)
        if self.degraded is not None:
            self.dropped_blocks += len(new)
            return 0
        written = 0
        for start in range(0, len(new), PACK_BATCH):
            batch = new[start:start + PACK_BATCH]
            rows = codec.empty_rows(len(batch))
            codec.pack([block for block, _, _ in batch], rows, range(len(batch)))
            for row, (_, digest, tokens) in zip(rows, batch, strict=True):
                if not self._write(digest, encode(self.fields, digest, tokens, row.numpy().tobytes())):
                    self.dropped_blocks += len(new) - written
                    return written
                written += 1
        return written

    def _write(self, digest: bytes, data: bytes) -> bool:
        if len(data) > self.capacity_bytes:
            return False
        self._make_room(len(data))
        final = self.path_of(digest)
        temp = self.root / f".{digest.hex()}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            with open(temp, "wb") as file:
                file.write(data)
            os.replace(temp, final)
        except OSError as error:
            with contextlib.suppress(OSError):
                temp.unlink()
            self._degrade(error)
            return False
        self._index[digest] = len(data)
        self.used_bytes += len(data)
        return True

    def _make_room(self, size: int) -> None:
        while self._index and self.used_bytes + size > self.capacity_bytes:
            digest, _ = next(iter(self._index.items()))
            self.discard([digest])
            self.evicted_blocks += 1

    def _degrade(self, error: OSError) -> None:
        code = errno.errorcode.get(error.errno or 0, "OSError")
        self.degraded = f"{code}: {error.strerror or error}"
        log.warning("the disk KV tier in %s stopped storing blocks (%s); requests go on without it, and blocks "
                    "already stored are still read", self.root, self.degraded)

    def load(self, codec: BlockCodec, handles: Sequence[memoryview], blocks: Sequence[int]) -> None:
        """Copy the payloads ``reserve`` returned into ``blocks`` of the cache."""
        if not handles:
            return
        rows = torch.stack([torch.frombuffer(payload, dtype=torch.uint8) for payload in handles])
        codec.unpack(rows, range(len(handles)), blocks)

    def release(self, handles: Sequence[memoryview]) -> None:
        """Nothing is held: a reserved payload is already in memory."""
