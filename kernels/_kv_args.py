"""Launcher-side handling of the KV format arguments: validation, and the format keywords every kernel takes.

Why it exists: ``store_kv`` and both attention launchers (and their references, which the CPU engine runs) take
the same ``kv_format`` / ``k_scale`` / ``v_scale`` triple. They must reject the same mistakes with the same
value-naming messages, against the one layout ``kv_quant.cache_shapes`` defines, and hand the kernels the same
pointers and strides, or a wrong scale tensor would be read as garbage without a word.
"""

from __future__ import annotations

import torch

from ._common import check_paged_cache, check_tensor, check_unit_last_stride
from ._quant_tiles import KV_FORMAT_CODES
from .kv_quant import cache_shapes, check_int4_head_dim, check_kv_format

_SCALE_MEANING = {
    "fp8_e4m3": "the static scale of each KV head",
    "int8": "one scale per cache slot and KV head, written by store_kv",
    "int4": "a (scale, zero) pair per group of 32 values per cache slot and KV head, written by store_kv",
}


def check_kv_args(key_cache: torch.Tensor, value_cache: torch.Tensor, kv_format: str, k_scale, v_scale, *,
                  num_kv_heads: int | None, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
    """Caches laid out as ``cache_shapes(kv_format, ...)`` says, with the scales that format needs (and only then)."""
    check_kv_format(kv_format)
    if kv_format == "int4":
        check_int4_head_dim(head_dim)
    check_paged_cache(key_cache, value_cache, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                      device=device, kv_format=kv_format)
    if kv_format == "auto":
        if k_scale is not None or v_scale is not None:
            raise ValueError("k_scale / v_scale were given with kv_format 'auto', which has no scales; pass the "
                             "quantized format they belong to (fp8_e4m3, int8 or int4)")
        return
    num_blocks, block_size, heads = key_cache.shape[:3]
    layout = cache_shapes(kv_format, num_blocks, block_size, heads, head_dim)
    shape, scale_dtype = layout["scale_shape"], layout["scale_dtype"]
    for name, scales in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scales is None:
            raise ValueError(f"kv_format {kv_format!r} needs {name}: {tuple(shape)} {scale_dtype}, "
                             f"{_SCALE_MEANING[kv_format]}")
        check_tensor(name, scales, ndim=len(shape), dtypes=(scale_dtype,), device=device)
        if tuple(scales.shape) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(scales.shape)} but kv_format {kv_format!r} with caches "
                             f"{tuple(key_cache.shape)} needs {tuple(shape)}: {_SCALE_MEANING[kv_format]}")
        check_unit_last_stride(name, scales)
    if k_scale.stride() != v_scale.stride():
        raise ValueError(f"k_scale strides {k_scale.stride()} and v_scale strides {v_scale.stride()} must match")


def kv_kernel_args(kv_format: str, key_cache: torch.Tensor, value_cache: torch.Tensor, k_scale, v_scale) -> dict:
    """The format keywords of every KV kernel: caches (fp8 as uint8 views), scale pointers and strides, KV_FORMAT.

    fp8 caches go in as bytes because the kernels encode/decode e4m3 bits themselves (see _quant_tiles). Formats
    without per-slot scales get strides 0, and the caches stand in for absent scale pointers (never read)."""
    if kv_format == "fp8_e4m3":
        key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
    per_slot = kv_format in ("int8", "int4")
    stride_sb, stride_ss, stride_sh = k_scale.stride()[:3] if per_slot else (0, 0, 0)
    return {
        "key_cache_ptr": key_cache, "value_cache_ptr": value_cache,
        "k_scale_ptr": key_cache if k_scale is None else k_scale,
        "v_scale_ptr": value_cache if v_scale is None else v_scale,
        "stride_sb": stride_sb, "stride_ss": stride_ss, "stride_sh": stride_sh,
        "stride_sg": k_scale.stride(3) if kv_format == "int4" else 0,
        "KV_FORMAT": KV_FORMAT_CODES[kv_format],
    }
