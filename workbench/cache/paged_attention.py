"""Attention over the paged KV cache for one mixed forward pass: the backend a paged forward hands the model.

The engine's model runner and the speculative draft proposer both run their models through it. A flat batch
(`workbench.cache.paged_batch`) puts decode sequences first (one query token each), then prefill chunks. For
each layer the backend writes the new keys and values into their slots, then runs the decode kernel over the
decode rows and the prefill kernel (causal inside the chunk, full over the cached prefix) over the rest: two
launches per layer whatever the batch mix. Token trees being verified are prefill rows restricted by the batch's
``tree_mask`` (`workbench.cache.paged_batch.tree_entry`). Kernels come from ``workbench_kernels``: Triton on
CUDA, references on the CPU.
"""

from __future__ import annotations

import torch

from workbench.cache.paged import PagedKVCache
from workbench.cache.paged_batch import PagedBatchMetadata
from workbench_kernels.paged_decode_attention import decode_gather_plan, paged_decode_attention
from workbench_kernels.paged_prefill_attention import paged_prefill_attention
from workbench_kernels.store_kv import store_kv


class PagedAttention:
    """``window``: each query sees only the last ``window`` keys of its sequence (a sliding-window layer group,
    `workbench.cache.grouped_attention`); None attends over all of them."""

    def __init__(self, cache: PagedKVCache, meta: PagedBatchMetadata, scale: float, window: int | None = None):
        self.cache, self.meta, self.scale, self.window = cache, meta, scale, window
        d = meta.num_decode_seqs
        self._prefill_starts = meta.query_start_loc[d:] - d  # prefill rows start after the decode rows
        # On the CPU, where the decode rows' keys are is worked out once here, not once per layer (it cost more
        # than the attention itself at batch 1: 261 -> 43 us per layer at 200 keys).
        self._decode_plan = None
        cpu = not cache.key[0].is_cuda
        if d and cpu:
            self._decode_plan = decode_gather_plan(meta.block_tables[:d], meta.context_lens[:d], cache.block_size,
                                                   window)
        # A float cache on the CPU stores each layer's keys and values with one index_copy_ apiece into the flat
        # slots: store_kv's general path redoes its slot arithmetic (and a padding check) on every layer, ~10
        # operators that cost more than the copy at batch 1. Padding (slot -1) keeps the general path.
        self._flat_slots = None
        if cpu and cache.kv_format == "auto" and bool((meta.slot_mapping >= 0).all()):
            self._flat_slots = meta.slot_mapping.long()

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write this forward's new keys and values into their slots of ``layer``."""
        cache = self.cache
        key_cache, value_cache = cache.key[layer], cache.value[layer]
        if self._flat_slots is not None and k.dtype == key_cache.dtype and v.dtype == value_cache.dtype:
            key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, self._flat_slots, k)
            value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, self._flat_slots, v)
        else:
            store_kv(k, v, key_cache, value_cache, self.meta.slot_mapping, kv_format=cache.kv_format,
                     k_scale=cache.key_scale[layer], v_scale=cache.value_scale[layer])

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta, d, cache = self.meta, self.meta.num_decode_seqs, self.cache
        key_cache, value_cache = cache.key[layer], cache.value[layer]
        fmt = {"kv_format": cache.kv_format, "k_scale": cache.key_scale[layer], "v_scale": cache.value_scale[layer],
               "window": self.window}
        self.store(layer, k, v)
        if d == meta.num_seqs:
            return paged_decode_attention(q, key_cache, value_cache, meta.block_tables, meta.context_lens, self.scale,
                                          **fmt, cpu_plan=self._decode_plan)
        prefill = paged_prefill_attention(q[d:], key_cache, value_cache, meta.block_tables[d:], self._prefill_starts,
                                          meta.context_lens[d:], self.scale, **fmt, tree_mask=meta.tree_mask)
        if d == 0:
            return prefill
        decode = paged_decode_attention(q[:d], key_cache, value_cache, meta.block_tables[:d], meta.context_lens[:d],
                                        self.scale, **fmt, cpu_plan=self._decode_plan)
        return torch.cat([decode, prefill])
