"""Attention for the batch-invariant mode: each query row computed the same way wherever it sits.

`workbench.models.row_invariant` says why the default path is not batch-invariant. Here a row sees keys 0..p
through tiles of exactly ``ROW_TILE`` query rows and blocks of exactly ``KEY_BLOCK`` keys with an online
softmax, so a decode step, the same position inside a whole prefill or a chunk, and a prefix read back from the
cache all reduce in the same order. Blocks past a row's position are masked to exactly zero weight and leave its
running max, sum and output unchanged.

Every tile of every sequence in the forward goes through one batched product per key block: a batched matrix
product computes each batch entry with the same kernel whatever the number of entries (checked in
tests/engine/test_batch_invariant.py), so batching the tiles keeps them invariant and costs one Python loop over key
blocks per layer. Slower than the fused kernels all the same; chapter 10 measures by how much.
"""

from __future__ import annotations

import torch

from workbench.cache.paged import PagedKVCache
from workbench.cache.paged_attention import PagedAttention
from workbench.cache.paged_batch import PagedBatchMetadata
from workbench.intmath import ceil_div
from workbench.models.row_invariant import ROW_TILE
from workbench_kernels._paged_gather import sequence_values

KEY_BLOCK = 64


def tile_attention(q_tiles: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   scale: float) -> torch.Tensor:
    """Attention of ``N`` tiles of ``ROW_TILE`` query rows, each over its own keys, in blocks of ``KEY_BLOCK``.

    q_tiles: [N, T, H, D]; positions: [N, T] (a row at position p sees keys 0..p; -1 marks padding rows);
    keys, values: [N, Hkv, L, D] with L a multiple of KEY_BLOCK. Returns [N, T, H, D] in the query's dtype."""
    n, t, num_heads, head_dim = q_tiles.shape
    num_kv = keys.shape[1]
    group = num_heads // num_kv
    # Query head h reads KV head h // group: lay the group's heads and the tile's rows out as one M = group * T.
    q = q_tiles.float().reshape(n, t, num_kv, group, head_dim).permute(0, 2, 3, 1, 4).reshape(n, num_kv, group * t,
                                                                                              head_dim)
    pos = positions[:, None, :].expand(n, group, t).reshape(n, 1, group * t, 1)
    shape = (n, num_kv, group * t)
    row_max = torch.full(shape, float("-inf"), dtype=torch.float32, device=q.device)
    row_sum = torch.zeros(shape, dtype=torch.float32, device=q.device)
    acc = torch.zeros(*shape, head_dim, dtype=torch.float32, device=q.device)
    block_ids = torch.arange(KEY_BLOCK, device=q.device)
    for b in range(0, int(positions.max()) + 1, KEY_BLOCK):
        k_block = keys[:, :, b:b + KEY_BLOCK].float()
        v_block = values[:, :, b:b + KEY_BLOCK].float()
        scores = torch.matmul(q, k_block.transpose(2, 3)) * scale  # [N, Hkv, G*T, KEY_BLOCK]
        scores = scores.masked_fill((b + block_ids) > pos, float("-inf"))
        new_max = torch.maximum(row_max, scores.amax(-1))
        safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
        weights = torch.exp(scores - safe_max[..., None])
        rescale = torch.exp(row_max - safe_max)
        row_sum = row_sum * rescale + weights.sum(-1)
        acc = acc * rescale[..., None] + torch.matmul(weights, v_block)
        row_max = new_max
    out = acc / row_sum.clamp_min(torch.finfo(torch.float32).tiny)[..., None]
    return out.reshape(n, num_kv, group, t, head_dim).permute(0, 3, 1, 2, 4).reshape(n, t, num_heads, head_dim) \
        .to(q_tiles.dtype)


def _padded_keys(keys: torch.Tensor, length: int) -> torch.Tensor:
    """[Hkv, m, D] -> [Hkv, length, D], zeros after m (zero keys and values: masked, and 0 * 0 stays 0)."""
    if keys.shape[1] == length:
        return keys
    return torch.cat([keys, keys.new_zeros(keys.shape[0], length - keys.shape[1], keys.shape[2])], dim=1)


def _tiles(query: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, H, D] rows and their positions -> [ceil(n / T), T, H, D] tiles and [.., T] positions (-1: padding)."""
    n = query.shape[0]
    count = ceil_div(n, ROW_TILE)
    q = query.new_zeros(count * ROW_TILE, *query.shape[1:])
    q[:n] = query
    pos = torch.full((count * ROW_TILE,), -1, dtype=torch.long, device=query.device)
    pos[:n] = positions
    return q.view(count, ROW_TILE, *query.shape[1:]), pos.view(count, ROW_TILE)


def invariant_attention(query: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                        scale: float) -> torch.Tensor:
    """Causal attention of one sequence's query rows, each computed the same way wherever it sits.

    query: [n, H, D] at absolute ``positions`` [n] of the sequence; keys, values: [Hkv, m, D] with m > max
    position. Query at position p attends to keys 0..p. Returns [n, H, D]."""
    q, pos = _tiles(query, positions)
    length = ceil_div(keys.shape[1], KEY_BLOCK) * KEY_BLOCK
    keys, values = _padded_keys(keys, length), _padded_keys(values, length)
    count = q.shape[0]
    out = tile_attention(q, pos, keys[None].expand(count, -1, -1, -1), values[None].expand(count, -1, -1, -1), scale)
    return out.reshape(-1, *query.shape[1:])[: query.shape[0]]


class BatchInvariantAttention(PagedAttention):
    """`PagedAttention` that stores KV the same way, then attends with `tile_attention`: every sequence's rows cut
    into tiles, each tile with its sequence's keys (read and dequantized through its block table), all tiles of
    the forward in one batched loop over key blocks."""

    def __init__(self, cache: PagedKVCache, meta: PagedBatchMetadata, scale: float):
        super().__init__(cache, meta, scale)
        starts = meta.query_start_loc.tolist()
        contexts = meta.context_lens.tolist()
        self._rows = [(b, start, end, ctx) for b, (start, end, ctx) in
                      enumerate(zip(starts, starts[1:], contexts, strict=False)) if end > start]
        length = ceil_div(max((ctx for *_, ctx in self._rows), default=1), KEY_BLOCK) * KEY_BLOCK
        self._length = length
        self._tile_seq = []  # which sequence (index into self._rows) each tile belongs to
        positions = []
        device = meta.context_lens.device
        for i, (_, start, end, ctx) in enumerate(self._rows):
            count = ceil_div(end - start, ROW_TILE)
            self._tile_seq += [i] * count
            pos = torch.full((count * ROW_TILE,), -1, dtype=torch.long, device=device)
            pos[:end - start] = torch.arange(ctx - (end - start), ctx, device=device)
            positions.append(pos.view(count, ROW_TILE))
        self._positions = torch.cat(positions) if positions else None
        self._tile_index = torch.tensor(self._tile_seq, dtype=torch.long, device=device)

    def _sequence_kv(self, layer: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cache, tables = self.cache, self.meta.block_tables
        keys, values = [], []
        for b, _, _, ctx in self._rows:
            keys.append(_padded_keys(sequence_values(cache.key[layer], cache.key_scale[layer], cache.kv_format,
                                                     dtype, tables[b], ctx)[0], self._length))
            values.append(_padded_keys(sequence_values(cache.value[layer], cache.value_scale[layer], cache.kv_format,
                                                       dtype, tables[b], ctx)[0], self._length))
        return torch.stack(keys), torch.stack(values)

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(q)
        if not self._rows:
            return out
        tiles = torch.cat([_tiles(q[start:end], torch.zeros(end - start, dtype=torch.long, device=q.device))[0]
                           for _, start, end, _ in self._rows])
        keys, values = self._sequence_kv(layer, q.dtype)
        done = tile_attention(tiles, self._positions, keys[self._tile_index], values[self._tile_index], self.scale)
        first = 0
        for _, start, end, _ in self._rows:
            count = ceil_div(end - start, ROW_TILE)
            out[start:end] = done[first:first + count].reshape(-1, *q.shape[1:])[: end - start]
            first += count
        return out

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.store(layer, k, v)
        return self.attend(layer, q)
