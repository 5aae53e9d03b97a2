"""Whole KV blocks moved between the paged cache and rows of bytes, in the cache's own format.

A block's KV is spread over every layer's key and value tensors (and, for int8 and int4, their per-slot scales).
The tier stores one block as one row: each of those tensors' slice for the block, as raw bytes, one after the
other. Quantized blocks therefore move as they are (int4 stays 4-bit, with its scales and zero points); nothing is
converted, so a restored block is bit-for-bit the block that was computed. fp8's static scales are per layer,
not per block: they are part of the tier's fingerprint (`workbench.cache.tier.keys`), not of the row.

On a GPU the blocks are gathered on the device and cross PCIe as one copy per tensor of all the blocks of a
transfer, not one per block and layer (vLLM 0.12 rearranged its cache layout for the same reason: per-layer,
per-block pieces of 8-72 KB ran far below the bus's bandwidth).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from workbench.cache.paged import PagedKVCache


class BlockCodec:
    """Packs blocks of one cache into byte rows and unpacks rows into blocks; rows are ``bytes_per_block`` wide."""

    def __init__(self, cache: PagedKVCache):
        self.cache, self.device = cache, cache.device
        self.parts: list[tuple[torch.Tensor, int, int]] = []  # (uint8 view of a tensor, offset in a row, bytes)
        offset = 0
        for tensor in cache.block_tensors():
            view = tensor.view(torch.uint8)
            size = view[0].numel()
            self.parts.append((view, offset, size))
            offset += size
        self.bytes_per_block = offset

    def empty_rows(self, count: int, *, pin: bool = False) -> torch.Tensor:
        return torch.empty(count, self.bytes_per_block, dtype=torch.uint8, pin_memory=pin)

    def pack(self, blocks: Sequence[int], dest: torch.Tensor, rows: Sequence[int]) -> None:
        """Copy each of ``blocks`` into row ``rows[i]`` of the host tensor ``dest`` ([n, bytes_per_block] uint8)."""
        if len(blocks) != len(rows):
            raise ValueError(f"{len(blocks)} blocks for {len(rows)} rows")
        if not blocks:
            return
        index = torch.tensor(list(blocks), device=self.device)
        where = torch.tensor(list(rows))
        for view, offset, size in self.parts:
            chunk = view.index_select(0, index).reshape(len(blocks), size)
            dest[where, offset:offset + size] = chunk.to(dest.device) if chunk.device != dest.device else chunk

    def unpack(self, src: torch.Tensor, rows: Sequence[int], blocks: Sequence[int]) -> None:
        """Write row ``rows[i]`` of the host tensor ``src`` into block ``blocks[i]`` of the cache."""
        if len(blocks) != len(rows):
            raise ValueError(f"{len(rows)} rows for {len(blocks)} blocks")
        if not blocks:
            return
        picked = src.index_select(0, torch.tensor(list(rows)))
        if self.device.type == "cuda":  # one host-to-device copy for the whole transfer
            picked = picked.pin_memory().to(self.device, non_blocking=True)
        index = torch.tensor(list(blocks), device=self.device)
        for view, offset, size in self.parts:
            view.index_copy_(0, index, picked[:, offset:offset + size].reshape(len(blocks), *view.shape[1:]))

    def synchronize(self) -> None:
        """Wait for the copies queued on the device (a transfer's time must include them)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
