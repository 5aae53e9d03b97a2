"""The textbook KV cache: one pre-allocated buffer of ``max_len`` positions per sequence slot.

Simple and fast to index, and the reference the paged cache is checked against. Its cost is what chapter 2
measures: every slot reserves memory for the longest sequence it might hold, whether or not it gets there.
"""

from __future__ import annotations

import torch

from workbench.config import ModelSpec
from workbench.models.attention import causal_attention_heads_first


class ContiguousKVCache:
    """Keys and values in [layers, slots, kv_heads, max_len, head_dim] buffers (head-major for attention)."""

    def __init__(self, spec: ModelSpec, *, max_batch: int, max_len: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        if max_batch < 1 or max_len < 1:
            raise ValueError(f"max_batch and max_len must be >= 1, got {max_batch} and {max_len}")
        shape = (spec.num_layers, max_batch, spec.num_kv_heads, max_len, spec.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.scale = spec.head_dim ** -0.5

    @property
    def reserved_bytes(self) -> int:
        """Bytes held by the buffers, used or not."""
        return 2 * self.k.numel() * self.k.element_size()

    def attention(self, slots: list[int], cached_lens: list[int], new_lens: list[int]) -> _ContiguousAttention:
        """A backend for one forward: sequence i occupies ``slots[i]``, already holds ``cached_lens[i]``
        positions and brings ``new_lens[i]`` new tokens (laid out consecutively in the flat batch)."""
        for start, n in zip(cached_lens, new_lens, strict=True):
            if start + n > self.max_len:
                raise ValueError(f"sequence would reach {start + n} positions; this cache holds {self.max_len}")
        return _ContiguousAttention(self, slots, cached_lens, new_lens)


class _ContiguousAttention:
    def __init__(self, cache: ContiguousKVCache, slots: list[int], cached_lens: list[int], new_lens: list[int]):
        self.cache, self.slots, self.cached_lens, self.new_lens = cache, slots, cached_lens, new_lens

    def decode_slot(self) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """For one sequence adding one token: its slot's key and value buffers ([layers, kv_heads, max_len,
        head_dim] views) and the token's position, for a caller that writes and attends in one call of its own
        (`workbench.models.gguf_layers`); None for any other forward."""
        if len(self.slots) != 1 or self.new_lens[0] != 1:
            return None
        slot = self.slots[0]
        return self.cache.k[:, slot], self.cache.v[:, slot], self.cached_lens[0]

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        outs, row = [], 0
        for slot, start, n in zip(self.slots, self.cached_lens, self.new_lens, strict=True):
            end = start + n
            kc, vc = self.cache.k[layer, slot], self.cache.v[layer, slot]
            kc[:, start:end] = k[row:row + n].transpose(0, 1)
            vc[:, start:end] = v[row:row + n].transpose(0, 1)
            out = causal_attention_heads_first(q[row:row + n].transpose(0, 1), kc[:, :end], vc[:, :end],
                                               self.cache.scale)
            outs.append(out.transpose(0, 1))
            row += n
        return outs[0] if len(outs) == 1 else torch.cat(outs)
