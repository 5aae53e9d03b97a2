"""The physical paged KV cache: per layer, key and value tensors of fixed-size blocks (and their scales).

Layout per layer: ``[num_blocks, block_size, num_kv_heads, head_dim]`` in the cache's storage format (see
``workbench_kernels.kv_quant``): the model dtype for ``auto``, float8 with a static per-head scale for
``fp8_e4m3``, int8 with one scale per token and head for ``int8``, packed int4 with a scale and zero point per
group of 32 for ``int4``. Which block belongs to which sequence is the block manager's business
(`workbench.cache.block_manager`); this module owns the memory, reports what it allocated, and copies blocks
when the block manager asks for copy-on-write.

With KV groups (`workbench.cache.kv_groups`: sliding-window layers beside full-attention ones) the pool holds
only as many tensors as the largest group has layers, and ``key[layer]`` is the tensor of the layer's index in
its group: layer ``i`` of every group shares it, each group's blocks being its own (the block manager hands a
block to one group at a time). The bytes then follow the groups, not the layers.
"""

from __future__ import annotations

import torch

from workbench.cache.kv_groups import KVGroupLayout
from workbench.config import ModelSpec
from workbench_kernels.kv_quant import allocate_cache, cache_shapes


class PagedKVCache:
    def __init__(self, spec: ModelSpec, num_blocks: int, block_size: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", kv_format: str = "auto", layout: KVGroupLayout | None = None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        self.num_blocks, self.block_size, self.kv_format = num_blocks, block_size, kv_format
        self.dtype, self.device = dtype, torch.device(device)
        self.layout = layout  # None: one tensor per layer, every block holding every layer
        shared = [(*self._allocate(spec), *self._allocate(spec))
                  for _ in range(spec.num_layers if layout is None else layout.tensors_per_block)]
        where = range(spec.num_layers) if layout is None else layout.tensor_of_layer
        self.key = [shared[i][0] for i in where]
        self.key_scale = [shared[i][1] for i in where]
        self.value = [shared[i][2] for i in where]
        self.value_scale = [shared[i][3] for i in where]
        self._per_slot_scales = cache_shapes(kv_format, 1, 1, spec.num_kv_heads, spec.head_dim)["scale_per_slot"]

    def _allocate(self, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor | None]:
        return allocate_cache(self.kv_format, self.num_blocks, self.block_size, spec.num_kv_heads, spec.head_dim,
                              self.dtype, self.device)

    def _tensors(self) -> list[torch.Tensor]:
        """Every tensor once (layers of different groups share theirs)."""
        seen = {id(t): t for t in (*self.key, *self.value, *self.key_scale, *self.value_scale) if t is not None}
        return list(seen.values())

    @property
    def allocated_bytes(self) -> int:
        """Bytes actually held by the cache tensors, scales included (what the engine reports as allocated)."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    @property
    def bytes_per_block(self) -> int:
        return self.allocated_bytes // self.num_blocks

    def set_static_scales(self, key_scales: list[torch.Tensor], value_scales: list[torch.Tensor]) -> None:
        """Per-layer ``[num_kv_heads]`` scales of an fp8 cache (from `workbench.cache.calibration`)."""
        if self.kv_format != "fp8_e4m3":
            raise ValueError(f"static scales belong to fp8_e4m3 caches, this one is {self.kv_format!r}")
        for layer, (k, v) in enumerate(zip(key_scales, value_scales, strict=True)):
            self.key_scale[layer].copy_(k)
            self.value_scale[layer].copy_(v)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks ``src -> dst`` in every layer (copy-on-write), per-slot scales included."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        for t in self._copied_tensors():
            t[dst] = t[src]

    def block_tensors(self) -> list[torch.Tensor]:
        """Every tensor a block's KV lives in (keys, values and per-slot scales, each shared tensor once), first
        dimension the block: what copying a block moves, and what a second KV tier stores
        (`workbench.cache.tier`)."""
        return self._copied_tensors()

    def _copied_tensors(self) -> list[torch.Tensor]:
        """What a block or slot copy moves: keys and values, and per-slot scales; each shared tensor once."""
        tensors = [*self.key, *self.value] + ([*self.key_scale, *self.value_scale] if self._per_slot_scales else [])
        return list({id(t): t for t in tensors}.values())

    def copy_slots(self, src: list[int], dst: list[int]) -> None:
        """Copy single token slots ``src -> dst`` in every layer, per-slot scales included (speculative decoding
        moves the KV of a token tree's accepted path into consecutive slots). All reads happen before writes."""
        if len(src) != len(dst):
            raise ValueError(f"{len(src)} source slots for {len(dst)} destinations")
        if not src:
            return
        s = torch.tensor(src, device=self.device)
        d = torch.tensor(dst, device=self.device)
        for t in self._copied_tensors():
            flat = t.view(-1, *t.shape[2:])
            if flat.element_size() == 1 and flat.is_floating_point():  # float8: CPU indexing kernels are missing
                flat = flat.view(torch.uint8)
            flat[d] = flat[s]
