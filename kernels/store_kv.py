"""Writing a step's new keys and values into the paged KV cache (one launch per layer).

Why it exists: every forward pass must put each new token's K/V into the cache slot the scheduler gave it before
attention reads the cache. A slot is ``block_id * block_size + offset``; slot -1 marks a padding token to skip.
Quantize-on-write (int8/fp8/int4 formats, a later issue) will hook in where the kernel stores.

``store_kv`` dispatches by device: CUDA tensors run the Triton kernel, CPU tensors the PyTorch reference.
"""

from __future__ import annotations

import torch

from ._common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_dim,
    check_launchable,
    check_paged_cache,
    check_tensor,
    check_unit_last_stride,
    next_pow2_at_least,
    tl,
    triton,
)
from ._paged_tiles import KV_FORMAT_NATIVE


@triton.jit
def _store_kv_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping_ptr,  # [num_tokens] int32/int64; -1 = skip
    stride_kt, stride_kh,  # key: token, head
    stride_vt, stride_vh,  # value: token, head
    stride_cb, stride_cs, stride_ch,  # both caches: block, slot in block, head
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two
    KV_FORMAT: tl.constexpr,
):
    """One program copies one token's key and value vectors of one KV head."""
    tl.static_assert(KV_FORMAT == 0, "only the native KV format (0) is implemented")
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    # int64 slot arithmetic: slot * head vector size passes 2**31 in caches of a few GiB.
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + head * stride_ch + d
    key = tl.load(key_ptr + token * stride_kt + head * stride_kh + d, mask=d_mask)
    value = tl.load(value_ptr + token * stride_vt + head * stride_vh + d, mask=d_mask)
    tl.store(key_cache_ptr + dst, key.to(key_cache_ptr.dtype.element_ty), mask=d_mask)
    tl.store(value_cache_ptr + dst, value.to(value_cache_ptr.dtype.element_ty), mask=d_mask)


def _check_store_args(key, value, key_cache, value_cache, slot_mapping) -> None:
    check_tensor("key", key, ndim=3, dtypes=FLOAT_DTYPES)
    device = key.device
    check_tensor("value", value, ndim=3, dtypes=(key.dtype,), device=device)
    if value.shape != key.shape:
        raise ValueError(f"value shape {tuple(value.shape)} must equal key shape {tuple(key.shape)}")
    check_unit_last_stride("key", key)
    check_unit_last_stride("value", value)
    num_tokens, num_kv_heads, head_dim = key.shape
    check_paged_cache(key_cache, value_cache, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=key.dtype,
                      device=device)
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES, device=device)
    check_dim("slot_mapping", slot_mapping, 0, num_tokens, "the number of tokens in key")


def store_kv_triton(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    """Triton launcher of ``store_kv``: checks the arguments, then one program per (token, KV head)."""
    _check_store_args(key, value, key_cache, value_cache, slot_mapping)
    check_launchable(_store_kv_kernel, key.device)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens, num_kv_heads)](
        key_ptr=key, value_ptr=value, key_cache_ptr=key_cache, value_cache_ptr=value_cache,
        slot_mapping_ptr=slot_mapping,
        stride_kt=key.stride(0), stride_kh=key.stride(1), stride_vt=value.stride(0), stride_vh=value.stride(1),
        stride_cb=key_cache.stride(0), stride_cs=key_cache.stride(1), stride_ch=key_cache.stride(2),
        HEAD_DIM=head_dim, BLOCK_SIZE=key_cache.shape[1], BLOCK_D=next_pow2_at_least(head_dim, 1),
        KV_FORMAT=KV_FORMAT_NATIVE,
    )


def store_kv_reference(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                       slot_mapping: torch.Tensor) -> None:
    """The specification: ``cache[slot // block_size, slot % block_size] = key[token]`` for every slot >= 0.

    key/value ``[num_tokens, num_kv_heads, head_dim]``; caches ``[num_blocks, block_size, num_kv_heads,
    head_dim]``, written in place; slot_mapping ``[num_tokens]``, -1 = padding (skipped). Two tokens must not
    share a slot (which one wins is unspecified)."""
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.all()):  # padding is rare: skip the boolean gather otherwise
        slots, key, value = slots[keep], key[keep], value[keep]
    block_size = key_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    key_cache[blocks, offsets] = key.to(key_cache.dtype)
    value_cache[blocks, offsets] = value.to(value_cache.dtype)


def store_kv(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write ``key``/``value`` rows into the paged caches at ``slot_mapping`` (see ``store_kv_reference``)."""
    if key.is_cuda:
        store_kv_triton(key, value, key_cache, value_cache, slot_mapping)
    else:
        store_kv_reference(key, value, key_cache, value_cache, slot_mapping)
