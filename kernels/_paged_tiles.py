"""Triton helpers shared by the paged decode and prefill attention kernels.

Why it exists: both kernels walk a sequence's keys in tiles of ``TILE`` tokens, find each token's cache slot
through the block table, load the key/value tile once, and fold it into an online softmax. Keeping those steps
here means one place to get the slot arithmetic right (64-bit, masked) and one place where quantized KV formats
dequantize after loading (the format arithmetic itself is in _quant_tiles).
"""

from __future__ import annotations

from ._common import tl, triton
from ._quant_tiles import KV_FORMAT_CODES, _dequantize_tile

# The KV_FORMAT constexpr: KV_FORMAT_CODES in _quant_tiles (0 auto, 1 fp8_e4m3, 2 int8, 3 int4).
KV_FORMAT_NATIVE = KV_FORMAT_CODES["auto"]  # the cache holds the activations' dtype (float32 / float16 / bfloat16)


@triton.jit
def _kv_tile_offsets(
    block_table_ptr,  # [max_blocks_per_seq] int32/int64: this sequence's row of the block table
    tokens,  # [TILE] int32: logical key positions of the tile
    token_mask,  # [TILE] bool: positions the sequence really has
    kv_head,
    stride_cb, stride_cs, stride_ch,  # cache strides: block, slot in block, KV head
    stride_sb, stride_ss, stride_sh,  # per-slot scale strides (int8 / int4; 0 otherwise): block, slot, KV head
    BLOCK_SIZE: tl.constexpr,
):
    """Element offsets ``[TILE]`` (int64) of each key's head vector in the paged cache, and of its scales.

    Every token looks up its own block, so a tile may span several small blocks or lie inside one large block.
    Masked tokens read no table entry: entries past a sequence's last block are garbage."""
    block_ids = tl.load(block_table_ptr + tokens // BLOCK_SIZE, mask=token_mask, other=0).to(tl.int64)
    in_block = (tokens % BLOCK_SIZE).to(tl.int64)
    head = kv_head.to(tl.int64)
    # int64 before multiplying: block_id * stride_cb passes 2**31 elements in caches of a few GiB.
    rows = block_ids * stride_cb + in_block * stride_cs + head * stride_ch
    scale_rows = block_ids * stride_sb + in_block * stride_ss + head * stride_sh
    return rows, scale_rows


@triton.jit
def _load_kv_tile(
    cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] (int4: head_dim // 2 bytes)
    scale_ptr,  # quantized formats' scales (see _quant_tiles._dequantize_tile); unused when KV_FORMAT == 0
    rows,  # [TILE] int64: offsets of the keys' head vectors
    scale_rows,  # [TILE] int64: offsets of their scales
    kv_head,
    d,  # [BLOCK_D] int32
    t_mask,  # [TILE] bool
    d_mask,  # [BLOCK_D] bool
    stride_sg,  # int4 scales: group stride
    KV_FORMAT: tl.constexpr,
):
    """A key or value tile ``[TILE, BLOCK_D]``: the cache's dtype, or float32 where quantized formats dequantize
    it in registers. Callers cast it to the dtype of their dots."""
    if KV_FORMAT == 0:  # KV_FORMAT_NATIVE (jit code may read only constexpr globals)
        tile = tl.load(cache_ptr + rows[:, None] + d[None, :], mask=t_mask[:, None] & d_mask[None, :], other=0.0)
    else:
        tile = _dequantize_tile(cache_ptr, scale_ptr, rows, scale_rows, kv_head, d, t_mask, d_mask, stride_sg,
                                KV_FORMAT)
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
