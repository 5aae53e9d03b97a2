"""Reference-side reads of the paged cache: gather the blocks a batch uses, dequantizing quantized formats.

Why it exists: the attention references (the specification, and what the CPU engine runs on every layer) read the
cache the same way for every KV format: gather only the blocks the sequences use, then, for quantized formats,
gather the per-slot scales alike and dequantize just those keys into the query's dtype. Everything after that is
the unchanged float path, so a quantized cache costs one dequantization of the keys actually read, never of the
whole cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._common import triton
from .kv_quant import dequantize_kv


def _bytes_if_fp8(cache: torch.Tensor, kv_format: str) -> torch.Tensor:
    # Gathers and fills run on the bytes: CPU kernels for float8 tensors are incomplete; 0x00 is +0.0.
    return cache.view(torch.uint8) if kv_format == "fp8_e4m3" else cache


def sequence_values(cache: torch.Tensor, scales: torch.Tensor | None, kv_format: str, dtype: torch.dtype,
                    block_table: torch.Tensor, context_len: int, start: int = 0) -> torch.Tensor:
    """One sequence's keys (or values) of positions ``start .. context_len - 1``, ``[1, num_kv_heads,
    context_len - start, head_dim]`` in ``dtype``. Blocks before ``start``'s are never read (a sliding window's
    table may no longer map them)."""
    size = cache.shape[1]
    first = start // size
    ids = block_table[first:triton.cdiv(context_len, size)].long()
    keep = slice(start - first * size, context_len - first * size)
    data = _bytes_if_fp8(cache, kv_format).index_select(0, ids).flatten(0, 1)[keep]
    if kv_format in ("int8", "int4"):
        scales = scales.index_select(0, ids).flatten(0, 1)[keep]
    return dequantize_kv(data, scales, kv_format, dtype).transpose(0, 1).unsqueeze(0)


@dataclass(frozen=True, slots=True)
class DecodeGatherPlan:
    """Where a decode batch's keys are, worked out once for all layers of a step.

    A model calls the decode reference once per layer with the same block tables, and on the CPU the index
    arithmetic costs more than the gather itself (measured: 75 us per gather at 200 keys, of which the copy is a
    small part; 30 layers x 2 gathers = 4.5 ms of a ~50 ms batch-1 step). A single sequence whose blocks are
    consecutive in the pool (the usual case: the free list hands them out in order) needs no gather at all.
    The caller owns the plan (the engine makes one per step): it is only valid for the tables it was made from."""

    num_seqs: int
    max_context: int
    min_context: int
    ids: torch.Tensor | None  # block ids to gather [num_seqs * num_blocks], or None for the consecutive case
    first_block: int  # consecutive case: the sequence's blocks are first_block .. first_block + num_blocks - 1
    num_blocks: int
    tail: torch.Tensor | None  # [num_seqs, max_context - min_context] True where a slot is past the end
    mask: torch.Tensor | None  # attention mask [num_seqs, 1, 1, max_context], None when all contexts are equal


def decode_gather_plan(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                       window: int | None = None) -> DecodeGatherPlan:
    """Work out the gather for these tables once; pass it to every layer's ``paged_decode_attention`` (with the
    same ``window``: each query then sees its sequence's last ``window`` keys only)."""
    if window is not None:
        return _window_gather_plan(block_tables, context_lens, block_size, window)
    num_seqs = block_tables.shape[0]
    max_context, min_context = int(context_lens.max()), int(context_lens.min())
    num_blocks = triton.cdiv(max_context, block_size)
    if num_seqs == 1:
        ids = block_tables[0, :num_blocks].long()
        first = int(ids[0])
        if torch.equal(ids, torch.arange(first, first + num_blocks, device=ids.device)):
            return DecodeGatherPlan(1, max_context, min_context, None, first, num_blocks, None, None)
    needed = (context_lens.long() + block_size - 1) // block_size
    columns = torch.arange(num_blocks, device=block_tables.device)
    # Table entries past a sequence's last block are garbage: read block 0 there (its slots get zeroed).
    ids = torch.where(columns < needed[:, None], block_tables[:, :num_blocks].long(), 0).flatten()
    tail = mask = None
    if min_context < max_context:
        tail = torch.arange(min_context, max_context, device=block_tables.device) >= context_lens[:, None]
        mask = (torch.arange(max_context, device=block_tables.device) < context_lens[:, None])[:, None, None, :]
    return DecodeGatherPlan(num_seqs, max_context, min_context, ids, 0, num_blocks, tail, mask)


def _window_gather_plan(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                        window: int) -> DecodeGatherPlan:
    """The gather of each sequence's last ``window`` keys: from the block holding its first visible key on, so a
    table whose earlier entries were freed is never read there; every slot outside the window is zeroed."""
    lens = context_lens.long()
    starts = (lens - window).clamp(min=0)
    first = starts // block_size
    count = (lens + block_size - 1) // block_size - first
    width = int(count.max())
    columns = torch.arange(width, device=block_tables.device)
    index = (first[:, None] + columns).clamp(max=block_tables.shape[1] - 1)
    ids = torch.where(columns < count[:, None], block_tables.long().gather(1, index), 0).flatten()
    positions = first[:, None] * block_size + torch.arange(width * block_size, device=block_tables.device)
    visible = (positions >= starts[:, None]) & (positions < lens[:, None])
    return DecodeGatherPlan(block_tables.shape[0], width * block_size, 0, ids, 0, width, ~visible,
                            visible[:, None, None, :])


def gather_planned(cache: torch.Tensor, plan: DecodeGatherPlan) -> torch.Tensor:
    """Each sequence's keys (or values, or per-slot scales) ``[num_seqs, max_context, *cache.shape[2:]]``, zero
    past its end: one gather of whole blocks (or a view, for consecutive blocks). Slots past a context (stale or
    NaN) are zeroed, because 0 * NaN poisons attention."""
    if plan.ids is None:
        blocks = cache[plan.first_block:plan.first_block + plan.num_blocks]
        return blocks.reshape(1, -1, *cache.shape[2:])[:, :plan.max_context]
    gathered = cache.index_select(0, plan.ids).view(plan.num_seqs, -1, *cache.shape[2:])[:, :plan.max_context]
    if plan.tail is not None:
        gathered[:, plan.min_context:].masked_fill_(plan.tail.view(*plan.tail.shape, *[1] * (cache.dim() - 2)), 0)
    return gathered


def planned_values(cache: torch.Tensor, scales: torch.Tensor | None, kv_format: str, dtype: torch.dtype,
                   plan: DecodeGatherPlan) -> torch.Tensor:
    """``gather_planned`` of the cache's values ``[num_seqs, max_context, num_kv_heads, head_dim]`` in ``dtype``;
    int8/int4 scales are gathered alike (zeroed past the end, so those keys dequantize to 0, never NaN)."""
    data = gather_planned(_bytes_if_fp8(cache, kv_format), plan)
    if kv_format in ("int8", "int4"):
        scales = gather_planned(scales, plan)
    return dequantize_kv(data, scales, kv_format, dtype)
