"""Prefill / chunked-prefill attention over the paged KV cache, for a variable-length batch in one launch.

Why it exists: a prompt chunk attends to the sequence's whole cached prefix and causally within itself, and the
chunks of many sequences (plus single-token rows, and later the speculative tokens being verified) arrive as one
flat batch. Query ``i`` of sequence ``b`` sits at position ``context_lens[b] - q_len_b + i``. A token tree being
verified is one such chunk, its nodes flattened parents first: an optional ``tree_mask`` (see ``_tree_mask``)
restricts what each row sees among the last keys to its ancestors.

The kernel packs (query token, query head of one GQA group) pairs into the rows of one tile, so every key tile is
loaded once for all heads of its KV head. Its grid numbers query blocks as vLLM's Triton attention does: sequence
``b``'s blocks start at ``query_start_loc[b] // BLOCK_Q + b``, an upper bound that needs no host sync; a binary
search over ``query_start_loc`` maps a program back to its sequence.

``paged_prefill_attention`` dispatches by device: CUDA tensors run the Triton kernel, CPU tensors the fast CPU
path ``paged_prefill_attention_cpu``; ``paged_prefill_attention_reference`` is the specification.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    LOG2_E,
    check_block_tables,
    check_dim,
    check_gqa,
    check_launchable,
    check_scale,
    check_tensor,
    check_unit_last_stride,
    dot_precision,
    is_interpreted,
    launch_knobs,
    next_pow2_at_least,
    output_tensor,
    tl,
    triton,
)
from ._kv_args import check_kv_args, kv_kernel_args
from ._paged_gather import sequence_values
from ._paged_tiles import _kv_tile_offsets, _load_kv_tile, _online_softmax_step
from ._tree_mask import check_tree_mask, visible_keys
from ._window import check_window
from .paged_decode_attention import paged_decode_attention_cpu

# Rows (query token x query head pairs) and keys per program, with 4 warps. Measured (benchmarks/RESULTS.md, "On a
# GPU"; bf16, causal, Llama-3-8B heads): on the H100 64/64/4 reached 293 TFLOP/s at 1 x 8,192 where the best,
# 128/128/8, reached 311; on the H200 the sweep spanned 256-315 TFLOP/s, 37-45% of the measured matmul peak.
DEFAULT_BLOCK_M = 64
DEFAULT_TILE = 64
# The CPU path runs a chunk of q_len queries over context_len keys as the tail of a causal square when
# q_len >= PAD_TO_CAUSAL * context_len. Measured (torch 2.13, 2 threads, 9:3 heads of 64, fp32), explicit-mask
# SDPA over the chunk against fused causal SDPA over the square: 11.0 vs 10.4 ms at 768 of 1,024 keys (the
# crossover), 18.4 vs 12.1 ms at 1,132 of 1,148, 57.0 vs 34.3 ms at 1,984 of 2,048; 7.3 vs 10.4 ms at 512 of 1,024.
PAD_TO_CAUSAL = 0.75


@triton.jit
def _find_sequence(
    query_start_loc_ptr,  # [num_seqs + 1] int32/int64
    q_block,
    num_seqs,
    BLOCK_Q: tl.constexpr,
):
    """The last sequence whose first query block (numbered ``query_start_loc[b] // BLOCK_Q + b``) is <= q_block."""
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


# num_seqs must stay a runtime value: Triton turns an integer argument equal to 1 into a constant, which would
# change the binary search's loop-carried types.
@triton.jit(do_not_specialize=["num_seqs"])
def _paged_prefill_kernel(
    out_ptr,  # [total_query_tokens, num_heads, head_dim]
    query_ptr,  # [total_query_tokens, num_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]; fp8 as uint8; int4 [..., head_dim // 2] uint8
    value_cache_ptr,  # like key_cache_ptr
    k_scale_ptr,  # fp8: [num_kv_heads] f32; int8: [num_blocks, block_size, num_kv_heads] f16; int4: [..., G, 2] f16
    v_scale_ptr,  # like k_scale_ptr
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32/int64
    query_start_loc_ptr,  # [num_seqs + 1] int32/int64: cumulative query lengths
    context_lens_ptr,  # [num_seqs] int32/int64: keys per sequence, this chunk included
    tree_mask_ptr,  # [total_query_tokens, mask_width] bool (TREE only): which of the last keys a row sees
    num_seqs,
    mask_width,  # TREE: the mask's columns stand for each sequence's last mask_width keys
    stride_mt,  # tree_mask: query row
    scale_log2,  # softmax scale * log2(e)
    window,  # keys a query sees, itself included (NO_WINDOW: all of them)
    stride_qt, stride_qh,  # query: token, head
    stride_ot, stride_oh,  # out: token, head
    stride_bt,  # block_tables: sequence
    stride_cb, stride_cs, stride_ch,  # both caches: block, slot in block, KV head
    stride_sb, stride_ss, stride_sh, stride_sg,  # both per-slot scales: block, slot, KV head, int4 group (else 0)
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_SIZE: tl.constexpr,  # cache block size
    BLOCK_M: tl.constexpr,  # rows per program: BLOCK_Q query tokens x GROUP heads, padded to a power of two
    BLOCK_Q: tl.constexpr,  # query tokens per program = BLOCK_M // GROUP
    BLOCK_D: tl.constexpr,  # HEAD_DIM padded to a power of two >= 16
    TILE: tl.constexpr,  # keys per iteration
    KV_FORMAT: tl.constexpr,  # 0 auto, 1 fp8_e4m3, 2 int8, 3 int4
    TREE: tl.constexpr,  # a tree mask restricts the last keys (see _tree_mask)
    DOT_IN_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program (query block, KV head): BLOCK_Q query tokens of one sequence x the GROUP heads of one KV head."""
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    first_q = (q_block - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # within the sequence's chunk
    if first_q >= q_len:  # a gap in the block numbering
        return
    prefix = tl.load(context_lens_ptr + seq) - q_len  # keys cached before this chunk

    m = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    q_idx = first_q + m // GROUP
    heads = kv_head * GROUP + m % GROUP
    row_mask = (m < BLOCK_Q * GROUP) & (q_idx < q_len)
    d_mask = d < HEAD_DIM
    io_mask = row_mask[:, None] & d_mask[None, :]
    rows = (q_start + q_idx).to(tl.int64)
    q = tl.load(query_ptr + rows[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=io_mask,
                other=0.0)
    if DOT_IN_FP32:
        q = q.to(tl.float32)
    positions = prefix + q_idx

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end_key = prefix + tl.minimum(first_q + BLOCK_Q, q_len)  # one past the last key any row of the block sees
    lowest = tl.maximum(prefix + first_q - window + 1, 0)  # the first key the block's first row still sees
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile in range(lowest // TILE, tl.cdiv(end_key, TILE)):
        tokens = tile * TILE + tl.arange(0, TILE)
        t_mask = (tokens < end_key) & (tokens >= lowest)
        kv_rows, kv_scale_rows = _kv_tile_offsets(table_row, tokens, t_mask, kv_head, stride_cb, stride_cs, stride_ch,
                                                  stride_sb, stride_ss, stride_sh, BLOCK_SIZE)
        keys = _load_kv_tile(key_cache_ptr, k_scale_ptr, kv_rows, kv_scale_rows, kv_head, d, t_mask, d_mask,
                             stride_sg, KV_FORMAT).to(q.dtype)
        values = _load_kv_tile(value_cache_ptr, v_scale_ptr, kv_rows, kv_scale_rows, kv_head, d, t_mask, d_mask,
                               stride_sg, KV_FORMAT).to(q.dtype)
        scores = tl.dot(q, tl.trans(keys), input_precision=DOT_PRECISION) * scale_log2
        visible = (tokens[None, :] <= positions[:, None]) & (tokens[None, :] > positions[:, None] - window)
        visible = visible & t_mask[None, :]
        if TREE:
            col = tokens - (prefix + q_len - mask_width)  # the key's column in the mask; < 0: not restricted
            in_mask = t_mask & (col >= 0)
            allowed = tl.load(tree_mask_ptr + rows[:, None] * stride_mt + col[None, :],
                              mask=row_mask[:, None] & in_mask[None, :], other=1)
            visible = visible & (allowed != 0)
        scores = tl.where(visible, scores, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(scores, values, m_i, l_i, acc, DOT_PRECISION)

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # l_i is 0 only in rows that are not stored
    o_ptrs = out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=io_mask)


def _check_prefill_args(query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale,
                        kv_format="auto", k_scale=None, v_scale=None, tree_mask=None) -> float:
    check_tensor("query", query, ndim=3, dtypes=FLOAT_DTYPES)
    check_unit_last_stride("query", query)
    _, num_heads, head_dim = query.shape
    check_kv_args(key_cache, value_cache, kv_format, k_scale, v_scale, num_kv_heads=None, head_dim=head_dim,
                  dtype=query.dtype, device=query.device)
    check_gqa(num_heads, key_cache.shape[2])
    check_tensor("context_lens", context_lens, ndim=1, dtypes=INDEX_DTYPES, device=query.device)
    num_seqs = context_lens.shape[0]
    check_tensor("query_start_loc", query_start_loc, ndim=1, dtypes=INDEX_DTYPES, device=query.device)
    check_dim("query_start_loc", query_start_loc, 0, num_seqs + 1, "len(context_lens) + 1")
    check_block_tables(block_tables, num_seqs, query.device)
    check_tree_mask(tree_mask, query)
    return check_scale(scale)


def paged_prefill_attention_triton(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                   block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                                   context_lens: torch.Tensor, scale: float, *, kv_format: str = "auto",
                                   k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                                   tree_mask: torch.Tensor | None = None, window: int | None = None,
                                   block_m: int = DEFAULT_BLOCK_M,
                                   tile_size: int = DEFAULT_TILE,
                                   num_warps: int | None = None, num_stages: int | None = None,
                                   out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton launcher of ``paged_prefill_attention``; ``block_m``, ``tile_size``, ``num_warps`` and
    ``num_stages`` are tuning knobs (None: Triton's defaults), ``out`` an optional preallocated output.
    Quantized caches are dequantized tile by tile in registers.

    ``query_start_loc[-1]`` must equal ``query.shape[0]``: it lives on the device, so it is not checked here."""
    scale = _check_prefill_args(query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale,
                                kv_format, k_scale, v_scale, tree_mask)
    window_arg = check_window(window)
    check_launchable(_paged_prefill_kernel, query.device)
    for name, value in (("block_m", block_m), ("tile_size", tile_size)):
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {value}")
    total_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs = context_lens.shape[0]
    out = output_tensor(out, (total_tokens, num_heads, head_dim), query.dtype, query.device)
    if total_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    block_m = max(block_m, next_pow2_at_least(group))
    block_q = block_m // group
    grid = (total_tokens // block_q + num_seqs, num_kv_heads)
    _paged_prefill_kernel[grid](
        out_ptr=out, query_ptr=query, block_tables_ptr=block_tables, query_start_loc_ptr=query_start_loc,
        context_lens_ptr=context_lens, num_seqs=num_seqs, scale_log2=scale * LOG2_E, window=window_arg,
        tree_mask_ptr=query if tree_mask is None else tree_mask,  # a placeholder pointer without a mask
        mask_width=0 if tree_mask is None else tree_mask.shape[1],
        stride_mt=0 if tree_mask is None else tree_mask.stride(0), TREE=tree_mask is not None,
        stride_qt=query.stride(0), stride_qh=query.stride(1), stride_ot=out.stride(0), stride_oh=out.stride(1),
        stride_bt=block_tables.stride(0),
        stride_cb=key_cache.stride(0), stride_cs=key_cache.stride(1), stride_ch=key_cache.stride(2),
        HEAD_DIM=head_dim, GROUP=group, BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_Q=block_q,
        BLOCK_D=next_pow2_at_least(head_dim), TILE=tile_size, DOT_IN_FP32=_dot_in_fp32(query.dtype),
        DOT_PRECISION=dot_precision(query.dtype), **kv_kernel_args(kv_format, key_cache, value_cache, k_scale, v_scale),
        **launch_knobs(num_warps, num_stages),
    )
    return out


def _dot_in_fp32(dtype: torch.dtype) -> bool:
    # The interpreter has no bfloat16 arithmetic (numpy): there bf16 tiles are widened after loading.
    return dtype == torch.float32 or (dtype == torch.bfloat16 and is_interpreted(_paged_prefill_kernel))


def _chunk_attention(query, keys, values, scale: float, tree_rows: torch.Tensor | None = None,
                     window: int | None = None, start: int = 0) -> torch.Tensor:
    """Attention of one sequence's chunk ``[q_len, num_heads, head_dim]`` over its keys/values ``[1, num_kv_heads,
    context_len - start, head_dim]`` (positions ``start..``), causal inside the chunk and restricted by its
    ``tree_mask`` rows, if any, and by a sliding ``window``."""
    q_len, context_len = query.shape[0], start + keys.shape[2]
    q = query.transpose(0, 1).unsqueeze(0)
    if window is not None:  # each row sees positions p - window + 1 .. p of the keys from ``start`` on
        visible = visible_keys(tree_rows, q_len, context_len, query.device)
        visible = visible.triu(diagonal=context_len - q_len - window + 1)[:, start:]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=scale, enable_gqa=True)
    elif q_len == context_len and tree_rows is None:  # plain causal (SDPA aligns is_causal to the top-left corner)
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=scale, enable_gqa=True)
    elif tree_rows is None and q_len >= PAD_TO_CAUSAL * context_len:
        # A chunk after a short cached prefix is the tail of a causal square: SDPA's fused causal path over the
        # square, the prefix's query rows zero and dropped, costs less than its explicit-mask path over the chunk
        # alone (PAD_TO_CAUSAL), and gives the tail rows the same bits (checked in
        # tests/kernels/test_kernel_paged_prefill.py).
        padded = torch.cat([q.new_zeros(1, q.shape[1], context_len - q_len, q.shape[3]), q], dim=2)
        out = F.scaled_dot_product_attention(padded, keys, values, is_causal=True, scale=scale,
                                             enable_gqa=True)[:, :, context_len - q_len:]
    else:
        visible = visible_keys(tree_rows, q_len, context_len, query.device)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


def _restricting(tree_mask: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    """A sequence's mask rows, or None where they restrict nothing (all True: an ordinary chunk)."""
    if tree_mask is None:
        return None
    own = tree_mask[rows]
    return None if bool(own.all()) else own


def paged_prefill_attention_reference(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                      block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                                      context_lens: torch.Tensor, scale: float, *, kv_format: str = "auto",
                                      k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                                      tree_mask: torch.Tensor | None = None,
                                      window: int | None = None) -> torch.Tensor:
    """The specification: query ``i`` of sequence ``b`` (row ``query_start_loc[b] + i``) sits at position
    ``p = context_lens[b] - q_len_b + i`` and attends to keys ``0..p`` of its sequence (``p - window + 1..p``
    with a ``window``; table entries before a chunk's first visible key are never read), read through the block
    table as in ``paged_decode_attention_reference`` (quantized formats likewise). Query head ``h`` reads KV head
    ``h // (num_heads // num_kv_heads)``. With a ``tree_mask`` ``[total_query_tokens, W]``, row ``r`` sees key
    ``context_lens[b] - W + j`` only where ``tree_mask[r, j]`` (see ``_tree_mask``). Returns
    ``[total_query_tokens, num_heads, head_dim]`` in the query's dtype.

    One sequence at a time; ``paged_prefill_attention_cpu`` is the fast CPU path."""
    fmt = {"kv_format": kv_format, "k_scale": k_scale, "v_scale": v_scale}
    if kv_format != "auto" or k_scale is not None or v_scale is not None or tree_mask is not None:
        _check_prefill_args(query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale, **fmt,
                            tree_mask=tree_mask)
    check_window(window)
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    starts, context = query_start_loc.tolist(), context_lens.tolist()
    for b, (start, end) in enumerate(zip(starts, starts[1:], strict=False)):
        if end > start:
            out[start:end] = _sequence_attention(query[start:end], key_cache, value_cache, block_tables[b],
                                                 context[b], scale, **fmt, window=window,
                                                 tree_rows=None if tree_mask is None else tree_mask[start:end])
    return out


def paged_prefill_attention_cpu(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                block_tables: torch.Tensor, query_start_loc: torch.Tensor, context_lens: torch.Tensor,
                                scale: float, *, kv_format: str = "auto", k_scale: torch.Tensor | None = None,
                                v_scale: torch.Tensor | None = None, tree_mask: torch.Tensor | None = None,
                                window: int | None = None) -> torch.Tensor:
    """``paged_prefill_attention_reference``'s result for the CPU engine: single-token rows (decodes verifying
    nothing, or a chunk's last token) that the tree mask does not restrict go through the batched
    ``paged_decode_attention_cpu`` in one call, the rest run one SDPA per sequence over only the blocks it needs."""
    fmt = {"kv_format": kv_format, "k_scale": k_scale, "v_scale": v_scale}
    if kv_format != "auto" or k_scale is not None or v_scale is not None or tree_mask is not None:
        _check_prefill_args(query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale, **fmt,
                            tree_mask=tree_mask)
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    starts, context = query_start_loc.tolist(), context_lens.tolist()
    masks = [_restricting(tree_mask, slice(start, end)) for start, end in zip(starts, starts[1:], strict=False)]
    q_lens = [end - start for start, end in zip(starts, starts[1:], strict=False)]
    singles = [b for b, n in enumerate(q_lens) if n == 1 and masks[b] is None]
    if singles:
        index = torch.tensor(singles, device=query.device)
        rows = query_start_loc[index].long()
        out[rows] = paged_decode_attention_cpu(query[rows], key_cache, value_cache, block_tables[index],
                                               context_lens[index], scale, **fmt, window=window)
    for b, n in enumerate(q_lens):
        if n > 1 or (n == 1 and masks[b] is not None):
            rows = slice(starts[b], starts[b] + n)
            out[rows] = _sequence_attention(query[rows], key_cache, value_cache, block_tables[b], context[b], scale,
                                            **fmt, tree_rows=masks[b], window=window)
    return out


def _sequence_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        block_table: torch.Tensor, context_len: int, scale: float, *, kv_format: str,
                        k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
                        tree_rows: torch.Tensor | None = None, window: int | None = None) -> torch.Tensor:
    """One sequence's query rows over the keys they can see, read (and dequantized) through its block table."""
    start = 0 if window is None else max(0, context_len - query.shape[0] - window + 1)
    keys = sequence_values(key_cache, k_scale, kv_format, query.dtype, block_table, context_len, start)
    values = sequence_values(value_cache, v_scale, kv_format, query.dtype, block_table, context_len, start)
    return _chunk_attention(query, keys, values, scale, tree_rows, window, start)


def paged_prefill_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor, context_lens: torch.Tensor,
                            scale: float, *, kv_format: str = "auto", k_scale: torch.Tensor | None = None,
                            v_scale: torch.Tensor | None = None, tree_mask: torch.Tensor | None = None,
                            window: int | None = None) -> torch.Tensor:
    """Causal attention of a flat batch of query chunks over their paged keys, optionally restricted by a token
    tree's mask and by a sliding ``window`` (see the reference)."""
    fmt = {"kv_format": kv_format, "k_scale": k_scale, "v_scale": v_scale, "tree_mask": tree_mask, "window": window}
    if query.is_cuda:
        return paged_prefill_attention_triton(query, key_cache, value_cache, block_tables, query_start_loc,
                                              context_lens, scale, **fmt)
    return paged_prefill_attention_cpu(query, key_cache, value_cache, block_tables, query_start_loc, context_lens,
                                       scale, **fmt)
