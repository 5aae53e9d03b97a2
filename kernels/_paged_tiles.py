"""Triton helpers shared by the paged decode and prefill attention kernels.

Why it exists: both kernels walk a sequence's keys in tiles of ``TILE`` tokens, find each token's cache slot
through the block table, load the key/value tile once, and fold it into an online softmax. Keeping those steps
here means one place to get the slot arithmetic right (64-bit, masked) and one place where quantized KV formats
will dequantize after loading.
"""

from __future__ import annotations

from ._common import tl, triton

# Cache formats the kernels understand (the KV_FORMAT constexpr). Quantized formats (a later issue) get new codes,
# plus per-token scale pointers, and are dequantized in _load_kv_tile.
KV_FORMAT_NATIVE = 0  # the cache holds the activations' dtype (float32 / float16 / bfloat16)


@triton.jit
def _kv_tile_offsets(
    block_table_ptr,  # [max_blocks_per_seq] int32/int64: this sequence's row of the block table
    tokens,  # [TILE] int32: logical key positions of the tile
    token_mask,  # [TILE] bool: positions the sequence really has
    kv_head,
    stride_cb, stride_cs, stride_ch,  # cache strides: block, slot in block, KV head
    BLOCK_SIZE: tl.constexpr,
):
    """Element offsets ``[TILE]`` (int64) of each key's head vector in the paged cache.

    Every token looks up its own block, so a tile may span several small blocks or lie inside one large block.
    Masked tokens read no table entry: entries past a sequence's last block are garbage."""
    block_ids = tl.load(block_table_ptr + tokens // BLOCK_SIZE, mask=token_mask, other=0)
    # int64 before multiplying: block_id * stride_cb passes 2**31 elements in caches of a few GiB.
    return (block_ids.to(tl.int64) * stride_cb + (tokens % BLOCK_SIZE).to(tl.int64) * stride_cs
            + kv_head.to(tl.int64) * stride_ch)


@triton.jit
def _load_kv_tile(
    cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    offsets,  # [ROWS, COLS] int64 element offsets
    mask,  # [ROWS, COLS] bool
    KV_FORMAT: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    """A key or value tile in the dtype the attention dots use. Quantized formats will dequantize here."""
    # Literal 0 = KV_FORMAT_NATIVE: jit code may read only constexpr globals.
    tl.static_assert(KV_FORMAT == 0, "only the native KV format is implemented")
    tile = tl.load(cache_ptr + offsets, mask=mask, other=0.0)
    if DOT_IN_FP32:
        tile = tile.to(tl.float32)
    return tile


@triton.jit
def _online_softmax_step(
    scores,  # [ROWS, TILE] float32: scaled by log2(e), -inf where masked
    values,  # [TILE, BLOCK_D]: the tile's values, same dtype as the dots
    m_i,  # [ROWS] float32: running maximum score
    l_i,  # [ROWS] float32: running sum of exp2(score - m_i)
    acc,  # [ROWS, BLOCK_D] float32: running sum of exp2(score - m_i) * value
    DOT_PRECISION: tl.constexpr,
):
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    # A row with every key so far masked still has m = -inf; shifting it by 0 keeps exp2 away from (-inf) - (-inf).
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(scores - shift[:, None])
    alpha = tl.exp2(m_i - shift)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values, input_precision=DOT_PRECISION)
    return m_new, l_i, acc
