"""Writing a step's new keys and values into the paged KV cache (one launch per layer).

Why it exists: every forward pass must put each new token's K/V into the cache slot the scheduler gave it before
attention reads the cache. A slot is ``block_id * block_size + offset``; slot -1 marks a padding token to skip.
Quantized formats (``kv_format`` fp8_e4m3 / int8 / int4, defined in ``kv_quant``) quantize on write: the kernel
quantizes each head vector in registers, and int8/int4 also write its scales into the per-slot scale tensors.

``store_kv`` dispatches by device: CUDA tensors run the Triton kernel, CPU tensors the PyTorch reference.
"""

from __future__ import annotations

import torch

from ._common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_dim,
    check_launchable,
    check_tensor,
    check_unit_last_stride,
    next_pow2_at_least,
    tl,
    triton,
)
from ._kv_args import check_kv_args, kv_kernel_args
from ._quant_tiles import _quantize_fp8, _quantize_int4, _quantize_int8
from .kv_quant import INT4_GROUP, quantize_kv


@triton.jit
def _store_head_vector(
    src_ptr,  # [head_dim] one token's key or value of one KV head (unit stride)
    dst_ptr,  # [head_dim] its cache slot (int4: [head_dim // 2] bytes)
    scale_ptr,  # fp8: [num_kv_heads] float32 input; int8: the slot's fp16 scale; int4: the slot's [groups, 2] fp16
    head,
    stride_sg,  # int4 scales: group stride
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_G: tl.constexpr,  # int4: groups of 32 per head vector, rounded up to a power of two
    KV_FORMAT: tl.constexpr,
):
    if KV_FORMAT == 3:  # int4 reads its groups itself, as even and odd halves
        _quantize_int4(src_ptr, dst_ptr, scale_ptr, stride_sg, HEAD_DIM // 32, BLOCK_G)
    else:
        d = tl.arange(0, BLOCK_D)
        d_mask = d < HEAD_DIM
        x = tl.load(src_ptr + d, mask=d_mask, other=0.0)
        if KV_FORMAT == 0:  # auto
            tl.store(dst_ptr + d, x.to(dst_ptr.dtype.element_ty), mask=d_mask)
        elif KV_FORMAT == 1:  # fp8_e4m3
            _quantize_fp8(x.to(tl.float32), dst_ptr, scale_ptr, head, d, d_mask)
        else:  # int8
            _quantize_int8(x.to(tl.float32), dst_ptr, scale_ptr, d, d_mask)


@triton.jit
def _store_kv_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]; fp8 as uint8; int4 [..., head_dim // 2] uint8
    value_cache_ptr,  # like key_cache_ptr
    k_scale_ptr,  # fp8: [num_kv_heads] f32; int8: [num_blocks, block_size, num_kv_heads] f16; int4: [..., G, 2] f16
    v_scale_ptr,  # like k_scale_ptr
    slot_mapping_ptr,  # [num_tokens] int32/int64; -1 = skip
    stride_kt, stride_kh,  # key: token, head
    stride_vt, stride_vh,  # value: token, head
    stride_cb, stride_cs, stride_ch,  # both caches: block, slot in block, head
    stride_sb, stride_ss, stride_sh, stride_sg,  # both per-slot scales: block, slot, head, int4 group (else 0)
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two
    BLOCK_G: tl.constexpr,  # int4: HEAD_DIM // 32 rounded up to a power of two
    KV_FORMAT: tl.constexpr,  # 0 auto, 1 fp8_e4m3, 2 int8, 3 int4
):
    """One program writes (quantizes) one token's key and value vectors of one KV head."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    # int64 slot arithmetic: slot * head vector size passes 2**31 in caches of a few GiB.
    block, in_block = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    dst = block * stride_cb + in_block * stride_cs + head * stride_ch
    scale_dst = block * stride_sb + in_block * stride_ss + head * stride_sh
    _store_head_vector(key_ptr + token * stride_kt + head * stride_kh, key_cache_ptr + dst, k_scale_ptr + scale_dst,
                       head, stride_sg, HEAD_DIM, BLOCK_D, BLOCK_G, KV_FORMAT)
    _store_head_vector(value_ptr + token * stride_vt + head * stride_vh, value_cache_ptr + dst,
                       v_scale_ptr + scale_dst, head, stride_sg, HEAD_DIM, BLOCK_D, BLOCK_G, KV_FORMAT)


def _check_store_args(key, value, key_cache, value_cache, slot_mapping, kv_format, k_scale, v_scale) -> None:
    check_tensor("key", key, ndim=3, dtypes=FLOAT_DTYPES)
    device = key.device
    check_tensor("value", value, ndim=3, dtypes=(key.dtype,), device=device)
    if value.shape != key.shape:
        raise ValueError(f"value shape {tuple(value.shape)} must equal key shape {tuple(key.shape)}")
    check_unit_last_stride("key", key)
    check_unit_last_stride("value", value)
    num_tokens, num_kv_heads, head_dim = key.shape
    check_kv_args(key_cache, value_cache, kv_format, k_scale, v_scale, num_kv_heads=num_kv_heads, head_dim=head_dim,
                  dtype=key.dtype, device=device)
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES, device=device)
    check_dim("slot_mapping", slot_mapping, 0, num_tokens, "the number of tokens in key")


def store_kv_triton(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, *, kv_format: str = "auto", k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> None:
    """Triton launcher of ``store_kv``: checks the arguments, then one program per (token, KV head)."""
    _check_store_args(key, value, key_cache, value_cache, slot_mapping, kv_format, k_scale, v_scale)
    check_launchable(_store_kv_kernel, key.device)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens, num_kv_heads)](
        key_ptr=key, value_ptr=value, slot_mapping_ptr=slot_mapping,
        stride_kt=key.stride(0), stride_kh=key.stride(1), stride_vt=value.stride(0), stride_vh=value.stride(1),
        stride_cb=key_cache.stride(0), stride_cs=key_cache.stride(1), stride_ch=key_cache.stride(2),
        HEAD_DIM=head_dim, BLOCK_SIZE=key_cache.shape[1], BLOCK_D=next_pow2_at_least(head_dim, 1),
        BLOCK_G=next_pow2_at_least(head_dim // INT4_GROUP, 1),
        **kv_kernel_args(kv_format, key_cache, value_cache, k_scale, v_scale),
    )


def store_kv_reference(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                       slot_mapping: torch.Tensor, *, kv_format: str = "auto", k_scale: torch.Tensor | None = None,
                       v_scale: torch.Tensor | None = None) -> None:
    """The specification: ``cache[slot // block_size, slot % block_size] = key[token]`` for every slot >= 0.

    key/value ``[num_tokens, num_kv_heads, head_dim]``; caches ``[num_blocks, block_size, num_kv_heads,
    head_dim]``, written in place; slot_mapping ``[num_tokens]``, -1 = padding (skipped). Two tokens must not
    share a slot (which one wins is unspecified). Quantized ``kv_format``s store ``kv_quant.quantize_kv(key)``:
    fp8 with the static ``k_scale``/``v_scale`` ``[num_kv_heads]``; int8/int4 also write the quantization scales
    into ``k_scale``/``v_scale`` at the same slots (layouts in ``kv_quant.cache_shapes``)."""
    if kv_format != "auto" or k_scale is not None or v_scale is not None:
        _check_store_args(key, value, key_cache, value_cache, slot_mapping, kv_format, k_scale, v_scale)
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.all()):  # padding is rare: skip the boolean gather otherwise
        slots, key, value = slots[keep], key[keep], value[keep]
    block_size = key_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    for x, cache, scales in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        data, new_scales = quantize_kv(x, kv_format, scales)
        if kv_format == "fp8_e4m3":  # scatter the bytes: index_put on float8 is not implemented everywhere
            cache, data = cache.view(torch.uint8), data.view(torch.uint8)
        cache[blocks, offsets] = data.to(cache.dtype)
        if kv_format in ("int8", "int4"):
            scales[blocks, offsets] = new_scales


def store_kv(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
             slot_mapping: torch.Tensor, *, kv_format: str = "auto", k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None) -> None:
    """Write (quantize) ``key``/``value`` rows into the paged caches at ``slot_mapping`` (see the reference)."""
    fmt = {"kv_format": kv_format, "k_scale": k_scale, "v_scale": v_scale}
    if key.is_cuda:
        store_kv_triton(key, value, key_cache, value_cache, slot_mapping, **fmt)
    else:
        store_kv_reference(key, value, key_cache, value_cache, slot_mapping, **fmt)
