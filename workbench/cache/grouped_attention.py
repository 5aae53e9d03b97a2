"""Attention over a paged cache whose layers form KV groups: each layer reads and writes its own group's blocks,
through its group's block tables, within its group's window.

The model calls one backend with a layer index (`workbench.models.attention`); this one keeps a
`PagedAttention` per group (its slots, its tables, its window) and hands each layer to its group's. The batch
of every group comes from the same entries through the unchanged batch builder
(`workbench.cache.paged_batch.build_paged_batch`), pointed at one group of the block manager at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.cache.hybrid_block_manager import HybridBlockManager
from workbench.cache.paged import PagedKVCache
from workbench.cache.paged_attention import PagedAttention
from workbench.cache.paged_batch import BatchEntry, PagedBatchMetadata, build_paged_batch


class GroupView:
    """One group of a `HybridBlockManager`, answering what the batch builder asks a block manager."""

    def __init__(self, blocks: HybridBlockManager, group: int):
        self.blocks, self.group = blocks, group

    def slots(self, seq_id: int, start: int, end: int) -> list[int]:
        return self.blocks.slots(seq_id, start, end, self.group)

    def block_table(self, seq_id: int) -> list[int]:
        return self.blocks.block_table(seq_id, self.group)


class GroupedPagedAttention:
    """Routes each layer to its KV group's `PagedAttention`."""

    def __init__(self, cache: PagedKVCache, metas: list[PagedBatchMetadata], scale: float):
        layout = cache.layout
        if layout is None or len(metas) != len(layout.groups):
            raise ValueError(f"need one batch metadata per KV group of the cache, got {len(metas)}")
        self.backends = [PagedAttention(cache, meta, scale, group.window)
                         for meta, group in zip(metas, layout.groups, strict=True)]
        self.group_of_layer = layout.group_of_layer

    @classmethod
    def for_batch(cls, cache: PagedKVCache, blocks: HybridBlockManager, entries: list[BatchEntry],
                  first: PagedBatchMetadata, scale: float, device: torch.device) -> GroupedPagedAttention:
        """The backend of one forward: ``first`` is group 0's metadata (the runner's batch), the other groups'
        are built from the same ``entries``."""
        metas = [first] + [build_paged_batch(GroupView(blocks, g), entries, device).metadata  # type: ignore[arg-type]
                           for g in range(1, blocks.num_groups)]
        return cls(cache, metas, scale)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.backends[self.group_of_layer[layer]](layer, q, k, v)


class WindowedDenseAttention:
    """The reference for windowed layers: one whole sequence per forward, no cache, each layer attending causally
    within its own window (``windows[layer]``, None for full attention). The engine's grouped path must give the
    same tokens (tests/engine/test_hybrid_engine.py); the what-if's perplexity reads every position's logits from it."""

    def __init__(self, windows: tuple[int | None, ...], scale: float):
        self.windows, self.scale = windows, scale

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        i = torch.arange(q.shape[0], device=q.device)
        visible = i[None, :] <= i[:, None]
        if self.windows[layer] is not None:
            visible &= i[None, :] > i[:, None] - self.windows[layer]
        out = F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), attn_mask=visible,
                                             scale=self.scale, enable_gqa=q.shape[1] != k.shape[1])
        return out[0].transpose(0, 1)
