"""Attention for the batch-invariant mode: each query row computed the same way wherever it sits.

`workbench.models.row_invariant` says why the default path is not batch-invariant. Here a row sees keys 0..p
through tiles of exactly ``ROW_TILE`` query rows and blocks of exactly ``KEY_BLOCK`` keys with an online
softmax, so a decode step, the same position inside a whole prefill or a chunk, and a prefix read back from the
cache all reduce in the same order. Blocks past a row's position are masked to exactly zero weight and leave its
running max, sum and output unchanged. Slower than the fused kernels; chapter 10 measures by how much.
"""

from __future__ import annotations

import torch

from workbench.cache.paged import PagedKVCache
from workbench.cache.paged_attention import PagedAttention
from workbench.cache.paged_batch import PagedBatchMetadata
from workbench.models.row_invariant import ROW_TILE
from workbench_kernels._paged_gather import sequence_values

KEY_BLOCK = 64


def invariant_attention(query: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                        scale: float) -> torch.Tensor:
    """Causal attention of one sequence's query rows, each computed the same way wherever it sits.

    query: [n, H, D] at absolute ``positions`` [n] of the sequence; keys, values: [Hkv, m, D] with m > max
    position. Query at position p attends to keys 0..p. Returns [n, H, D]."""
    n, num_heads, head_dim = query.shape
    keys = keys.repeat_interleave(num_heads // keys.shape[0], dim=0)  # [H, m, D]
    values = values.repeat_interleave(num_heads // values.shape[0], dim=0)
    padded_n = -(-n // ROW_TILE) * ROW_TILE
    q = query.new_zeros(padded_n, num_heads, head_dim)
    q[:n] = query
    pos = torch.full((padded_n,), -1, dtype=torch.long, device=query.device)
    pos[:n] = positions
    m = keys.shape[1]
    padded_m = -(-m // KEY_BLOCK) * KEY_BLOCK
    if padded_m != m:
        keys = torch.cat([keys, keys.new_zeros(num_heads, padded_m - m, head_dim)], dim=1)
        values = torch.cat([values, values.new_zeros(num_heads, padded_m - m, head_dim)], dim=1)
    out = torch.empty(padded_n, num_heads, head_dim, dtype=query.dtype, device=query.device)
    block_ids = torch.arange(KEY_BLOCK, device=query.device)
    for t in range(0, padded_n, ROW_TILE):
        q_tile = q[t:t + ROW_TILE].transpose(0, 1)  # [H, T, D]
        p_tile = pos[t:t + ROW_TILE]
        top = int(p_tile.max())
        row_max = torch.full((num_heads, ROW_TILE), float("-inf"), dtype=torch.float32, device=query.device)
        row_sum = torch.zeros(num_heads, ROW_TILE, dtype=torch.float32, device=query.device)
        acc = torch.zeros(num_heads, ROW_TILE, head_dim, dtype=torch.float32, device=query.device)
        for b in range(0, top + 1, KEY_BLOCK):
            k_block, v_block = keys[:, b:b + KEY_BLOCK].float(), values[:, b:b + KEY_BLOCK].float()
            scores = torch.matmul(q_tile.float(), k_block.transpose(1, 2)) * scale  # [H, T, KEY_BLOCK]
            visible = (b + block_ids)[None, :] <= p_tile[:, None]  # [T, KEY_BLOCK]
            scores = scores.masked_fill(~visible, float("-inf"))
            new_max = torch.maximum(row_max, scores.amax(-1))
            safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
            weights = torch.exp(scores - safe_max[..., None])
            rescale = torch.exp(row_max - safe_max)
            row_sum = row_sum * rescale + weights.sum(-1)
            acc = acc * rescale[..., None] + torch.matmul(weights, v_block)
            row_max = new_max
        done = (acc / row_sum.clamp_min(torch.finfo(torch.float32).tiny)[..., None]).transpose(0, 1)
        out[t:t + ROW_TILE] = done.to(query.dtype)
    return out[:n]


class BatchInvariantAttention(PagedAttention):
    """`PagedAttention` that stores KV the same way, then attends with `invariant_attention`, one sequence at a
    time, each sequence's keys read (and dequantized) through its block table."""

    def __init__(self, cache: PagedKVCache, meta: PagedBatchMetadata, scale: float):
        super().__init__(cache, meta, scale)
        starts = meta.query_start_loc.tolist()
        contexts = meta.context_lens.tolist()
        self._rows = [(start, end, ctx) for start, end, ctx in zip(starts, starts[1:], contexts, strict=False)]

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        cache, meta = self.cache, self.meta
        out = torch.empty_like(q)
        for b, (start, end, context) in enumerate(self._rows):
            if end == start:
                continue
            keys = sequence_values(cache.key[layer], cache.key_scale[layer], cache.kv_format, q.dtype,
                                   meta.block_tables[b], context)[0]
            values = sequence_values(cache.value[layer], cache.value_scale[layer], cache.kv_format, q.dtype,
                                     meta.block_tables[b], context)[0]
            positions = torch.arange(context - (end - start), context, device=q.device)
            out[start:end] = invariant_attention(q[start:end], positions, keys, values, self.scale)
        return out

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.store(layer, k, v)
        return self.attend(layer, q)
