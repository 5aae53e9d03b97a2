"""Reference-side reads of the paged cache: gather the blocks a batch uses, dequantizing quantized formats.

Why it exists: the attention references (the specification, and what the CPU engine runs on every layer) read the
cache the same way for every KV format: gather only the blocks the sequences use, then, for quantized formats,
gather the per-slot scales alike and dequantize just those keys into the query's dtype. Everything after that is
the unchanged float path, so a quantized cache costs one dequantization of the keys actually read, never of the
whole cache.
"""

from __future__ import annotations

import torch

from .kv_quant import dequantize_kv


def gather_padded_kv(cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                     max_context: int, min_context: int) -> torch.Tensor:
    """Each sequence's keys (or values, or per-slot scales) ``[num_seqs, max_context, *cache.shape[2:]]``, zero
    past its end.

    One gather of whole blocks; table entries past a sequence's last block are garbage, so they read block 0
    instead, and slots past the context (stale or NaN) are zeroed, because 0 * NaN poisons attention."""
    num_seqs = block_tables.shape[0]
    block_size = cache.shape[1]
    num_blocks = -(-max_context // block_size)
    needed = (context_lens.long() + block_size - 1) // block_size
    columns = torch.arange(num_blocks, device=cache.device)
    ids = torch.where(columns < needed[:, None], block_tables[:, :num_blocks].long(), 0)
    gathered = cache.index_select(0, ids.flatten()).view(num_seqs, num_blocks * block_size, *cache.shape[2:])
    gathered = gathered[:, :max_context]
    if min_context < max_context:  # only the tail can hold slots past some sequence's end
        tail = torch.arange(min_context, max_context, device=cache.device) >= context_lens[:, None]
        gathered[:, min_context:].masked_fill_(tail.view(*tail.shape, *[1] * (cache.dim() - 2)), 0)
    return gathered


def _bytes_if_fp8(cache: torch.Tensor, kv_format: str) -> torch.Tensor:
    # Gathers and fills run on the bytes: CPU kernels for float8 tensors are incomplete; 0x00 is +0.0.
    return cache.view(torch.uint8) if kv_format == "fp8_e4m3" else cache


def gather_padded_values(cache: torch.Tensor, scales: torch.Tensor | None, kv_format: str, dtype: torch.dtype,
                         block_tables: torch.Tensor, context_lens: torch.Tensor, max_context: int,
                         min_context: int) -> torch.Tensor:
    """``gather_padded_kv`` of the cache's values ``[num_seqs, max_context, num_kv_heads, head_dim]`` in ``dtype``."""
    data = gather_padded_kv(_bytes_if_fp8(cache, kv_format), block_tables, context_lens, max_context, min_context)
    if kv_format in ("int8", "int4"):  # zeroed scales past the end: those keys dequantize to 0, never NaN
        scales = gather_padded_kv(scales, block_tables, context_lens, max_context, min_context)
    return dequantize_kv(data, scales, kv_format, dtype)


def sequence_values(cache: torch.Tensor, scales: torch.Tensor | None, kv_format: str, dtype: torch.dtype,
                    block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """One sequence's keys (or values) ``[1, num_kv_heads, context_len, head_dim]`` in ``dtype``."""
    ids = block_table[:-(-context_len // cache.shape[1])].long()
    data = _bytes_if_fp8(cache, kv_format).index_select(0, ids).flatten(0, 1)[:context_len]
    if kv_format in ("int8", "int4"):
        scales = scales.index_select(0, ids).flatten(0, 1)[:context_len]
    return dequantize_kv(data, scales, kv_format, dtype).transpose(0, 1).unsqueeze(0)
