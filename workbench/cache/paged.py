"""The physical paged KV cache: per layer, one key and one value tensor of fixed-size blocks.

Layout per layer: ``[num_blocks, block_size, num_kv_heads, head_dim]``. Which block belongs to which sequence
is the block manager's business (`workbench.cache.block_manager`, pure bookkeeping); this module only owns the
memory, reports what it allocated, and copies blocks when the block manager asks for copy-on-write.
"""

from __future__ import annotations

import torch

from workbench.config import ModelSpec


class PagedKVCache:
    def __init__(self, spec: ModelSpec, num_blocks: int, block_size: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.key = [torch.empty(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
        self.value = [torch.empty(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
        self.num_blocks, self.block_size = num_blocks, block_size
        self.dtype, self.device = dtype, torch.device(device)

    @property
    def allocated_bytes(self) -> int:
        """Bytes actually held by the cache tensors (what the engine reports as allocated)."""
        return sum(t.numel() * t.element_size() for t in (*self.key, *self.value))

    @property
    def bytes_per_block(self) -> int:
        return self.allocated_bytes // self.num_blocks

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks ``src -> dst`` in every layer (copy-on-write after a fork)."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        for layer in (*self.key, *self.value):
            layer[dst] = layer[src]

    def poison(self, value: float = float("nan")) -> None:
        """Fill every slot (tests: a read of a slot nobody wrote then shows up as NaN)."""
        for t in (*self.key, *self.value):
            t.fill_(value)
