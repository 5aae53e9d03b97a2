"""Quantized KV-cache formats: their cache layouts, and the PyTorch quantize/dequantize that specify them.

Why it exists: the engine allocates caches from ``cache_shapes``, ``store_kv`` quantizes on write, and both
attention kernels dequantize on read; all of them (Triton and reference alike) must agree on one definition of
each format, bit for bit. This module is that definition, plus the round-trip error bound each format implies.

    auto      the activations' dtype, no scales
    fp8_e4m3  ``[NB, BS, H, D]`` float8_e4m3fn; static scales ``[H]`` float32 per (layer, KV head), an INPUT.
              q = e4m3(clamp(x / scale, -448, 448)) (round to nearest even); x' = float(q) * scale
    int8      ``[NB, BS, H, D]`` int8; scales ``[NB, BS, H]`` float16, one per token per KV head, written by store.
              scale = fp16(max(amax|x| / 127, 2**-14)); q = clamp(round(x / scale), -127, 127); x' = q * scale
    int4      ``[NB, BS, H, D // 2]`` uint8, element 2i in the low nibble and 2i+1 in the high one; scales
              ``[NB, BS, H, D // 32, 2]`` float16 = (scale, zero) per group of 32 along head_dim, written by store.
              scale = fp16(max((hi - lo) / 15, 2**-14)), zero = fp16(lo); q = clamp(round((x - zero) / scale), 0, 15);
              x' = q * scale + zero

Rules shared by all formats: arithmetic in float32; ``round`` is round-half-to-even (``torch.round``); scales are
floored at 2**-14, the smallest normal float16, so that a constant or all-zero vector still gets a finite,
nonzero scale that float16 stores exactly; quantization divides by the float16-rounded scale (and subtracts the
float16-rounded zero), so that dequantization reproduces what was rounded. Values must stay inside float16's range
(|x| < 65504; for int8, amax / 127 < 65504): scales and zeros are float16. NaN inputs give unspecified codes.
"""

from __future__ import annotations

import torch

KV_FORMATS = ("auto", "fp8_e4m3", "int8", "int4")
QUANTIZED_KV_FORMATS = KV_FORMATS[1:]
FP8_MAX = 448.0  # largest finite float8_e4m3fn
INT8_MAX = 127  # symmetric: -128 is never produced, so negation is exact
INT4_LEVELS = 15  # codes 0..15
INT4_GROUP = 32  # elements of head_dim sharing one (scale, zero)
SCALE_FLOOR = 2.0**-14  # smallest normal float16: representable exactly, and no division by zero
_FP16_EPS = 2.0**-11  # relative rounding of a float16 (half an ulp at 1.0)


def fp8_storage_dtype() -> torch.dtype:
    """The dtype the engine allocates fp8 caches in: real ``float8_e4m3fn``.

    The interpreter cannot cast to fp8 correctly (measured: 125.9 -> 64, ties not to even), so the kernels never
    ask it to: launchers pass the cache as a ``uint8`` view and the kernels encode and decode the e4m3 bits with
    integer arithmetic, identically on CUDA and under the interpreter. The cache itself stays float8."""
    return torch.float8_e4m3fn


def check_kv_format(kv_format: str) -> str:
    if kv_format not in KV_FORMATS:
        raise ValueError(f"unknown kv_format {kv_format!r}; choose one of {', '.join(KV_FORMATS)}")
    return kv_format


def check_int4_head_dim(head_dim: int) -> None:
    if head_dim % INT4_GROUP:
        raise ValueError(f"kv_format 'int4' needs head_dim divisible by {INT4_GROUP} (groups of {INT4_GROUP} values "
                         f"share a scale and zero, two values per byte), got head_dim {head_dim}")


def cache_shapes(kv_format: str, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32) -> dict:
    """What to allocate for ONE of a layer's key or value caches (the other is alike).

    Returns ``{"data_shape", "data_dtype", "scale_shape", "scale_dtype", "scale_per_slot"}``. ``dtype`` is the
    activations' dtype, used by ``auto``. ``scale_shape`` is None for ``auto``; for ``fp8_e4m3`` it is the static
    ``[num_kv_heads]`` float32 scale the engine calibrates and passes in (``scale_per_slot`` False); for int8/int4
    the scales live beside the data, one entry per cache slot, and ``store_kv`` writes them."""
    check_kv_format(kv_format)
    slots = (num_blocks, block_size, num_kv_heads)
    if kv_format == "auto":
        return {"data_shape": (*slots, head_dim), "data_dtype": dtype, "scale_shape": None, "scale_dtype": None,
                "scale_per_slot": False}
    if kv_format == "fp8_e4m3":
        return {"data_shape": (*slots, head_dim), "data_dtype": fp8_storage_dtype(), "scale_shape": (num_kv_heads,),
                "scale_dtype": torch.float32, "scale_per_slot": False}
    if kv_format == "int8":
        return {"data_shape": (*slots, head_dim), "data_dtype": torch.int8, "scale_shape": slots,
                "scale_dtype": torch.float16, "scale_per_slot": True}
    check_int4_head_dim(head_dim)
    return {"data_shape": (*slots, head_dim // 2), "data_dtype": torch.uint8,
            "scale_shape": (*slots, head_dim // INT4_GROUP, 2), "scale_dtype": torch.float16, "scale_per_slot": True}


def slot_bytes(kv_format: str, num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes one cache slot takes in ``kv_format``: one token's keys (or values) of one layer, every KV head, with
    its per-slot scales. fp8's static scales belong to a layer, not a slot, and are not counted. Derived from
    ``cache_shapes``, so every size the workbench reports is the layout the kernels read."""
    shapes = cache_shapes(kv_format, 1, 1, num_kv_heads, head_dim, dtype)
    total = _num_bytes(shapes["data_shape"], shapes["data_dtype"])
    if shapes["scale_per_slot"]:
        total += _num_bytes(shapes["scale_shape"], shapes["scale_dtype"])
    return total


def _num_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    count = 1
    for size in shape:
        count *= size
    return count * torch.empty(0, dtype=dtype).element_size()


def allocate_cache(kv_format: str, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                   dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """An empty ``(data, scales)`` pair laid out by ``cache_shapes``; fp8 scales start at 1.0, others empty/None."""
    shapes = cache_shapes(kv_format, num_blocks, block_size, num_kv_heads, head_dim, dtype)
    data = torch.empty(shapes["data_shape"], dtype=shapes["data_dtype"], device=device)
    if shapes["scale_shape"] is None:
        return data, None
    make = torch.empty if shapes["scale_per_slot"] else torch.ones
    return data, make(shapes["scale_shape"], dtype=shapes["scale_dtype"], device=device)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 ``[..., D]`` (any integer dtype) -> bytes ``[..., D // 2]``: element 2i low nibble, 2i+1 high."""
    pairs = codes.to(torch.uint8).unflatten(-1, (-1, 2))
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Bytes ``[..., D // 2]`` -> codes ``[..., D]`` uint8 (inverse of ``pack_int4``)."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


def _fp16_scale(scale32: torch.Tensor) -> torch.Tensor:
    return scale32.clamp_min(SCALE_FLOOR).half()


def quantize_kv(x: torch.Tensor, kv_format: str, scale: torch.Tensor | None = None):
    """``x [..., H, D]`` -> ``(data, scales)`` as stored in the cache (see the module docstring for each format).

    ``scale`` is the fp8 ``[H]`` float32 input (required for fp8, else unused). For fp8 ``scales`` is that input;
    for ``auto`` the data is ``x`` itself and ``scales`` None."""
    check_kv_format(kv_format)
    if kv_format == "auto":
        return x, None
    xf = x.float()
    if kv_format == "fp8_e4m3":
        if scale is None:
            raise ValueError("kv_format 'fp8_e4m3' needs its static per-KV-head scale ([num_kv_heads] float32)")
        q = (xf / scale.float()[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return q, scale
    if kv_format == "int8":
        scales = _fp16_scale(xf.abs().amax(dim=-1) / INT8_MAX)
        q = (xf / scales.float()[..., None]).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
        return q, scales
    check_int4_head_dim(x.shape[-1])
    groups = xf.unflatten(-1, (-1, INT4_GROUP))
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    scales, zeros = _fp16_scale((hi - lo) / INT4_LEVELS), lo.half()
    codes = ((groups - zeros.float()[..., None]) / scales.float()[..., None]).round().clamp(0, INT4_LEVELS)
    return pack_int4(codes.flatten(-2)), torch.stack([scales, zeros], dim=-1)


def fp8_e4m3_to_float(data: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn values (or their uint8 bits) as float32, exactly as ``.float()`` gives them, faster on CPU.

    torch converts float8 element by element; placed in a float16's bit pattern, an e4m3 value reads as that
    float16 (exponent bias 15 instead of 7) times 2**-8, subnormals included, and float16 converts vectorized.
    Measured, 1 thread, 3.1M values (32 seqs x 512 keys x 3 heads x 64), best of 25: ``.float()`` 9.5 ms, this
    2.2 ms (medians 9.6 and 4.9-13.8 ms: its int16 temporaries make it sensitive to a busy machine)."""
    half = data.view(torch.int8).to(torch.int16).bitwise_left_shift_(7)  # sign-extended: bits 15 and 14 = sign
    # The NaN codes (magnitude 0x7F) are the only ones whose magnitude + 0x80 carries into bit 14; setting that
    # bit makes their float16 exponent all ones: NaN.
    nan = (half & 0x3F80).add_(0x80).bitwise_and_(0x4000)
    half.bitwise_and_(-16512).bitwise_or_(nan)  # -16512 = 0xBF80: sign, exponent and mantissa bits
    return half.view(torch.float16).float().mul_(256.0)


def dequantize_kv(data: torch.Tensor, scales: torch.Tensor | None, kv_format: str,
                  out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Stored ``data [..., H, D or D // 2]`` and ``scales`` -> values ``[..., H, D]`` in ``out_dtype``.

    Computed in float32, rounded to ``out_dtype`` once, as the kernels do. Leading dims are free: the attention
    references pass gathered ``[seqs, keys, H, ...]`` blocks, with per-slot scales gathered alike."""
    check_kv_format(kv_format)
    if kv_format == "auto":
        return data.to(out_dtype)
    if kv_format == "fp8_e4m3":
        values = fp8_e4m3_to_float(data).mul_(scales.float()[:, None])
    elif kv_format == "int8":
        values = data.float() * scales.float()[..., None]
    else:
        codes = unpack_int4(data).unflatten(-1, (-1, INT4_GROUP)).float()
        scales = scales.float()
        values = (codes * scales[..., 0:1] + scales[..., 1:2]).flatten(-2)
    return values.to(out_dtype)


def roundtrip_error_bound(x: torch.Tensor, scales: torch.Tensor, kv_format: str) -> torch.Tensor:
    """The largest ``|x - dequantize_kv(quantize_kv(x))|`` each element may show (float32, shaped like ``x``).

    ``scales`` as ``quantize_kv`` returned them. Each bound is the format's rounding step plus a float32 slack of
    2**-12 relative (the division x / scale is itself rounded, by up to 2**-17 of a code at |code| 127):
      int8: scale / 2 (rounding to an integer code; clamping at 127 costs only scale's fp16 rounding, < scale / 2);
      int4: scale / 2 + |lo - zero| (the zero is lo rounded to float16: values near lo may clamp at code 0);
      fp8:  scale * max(2**-4 * |y|, 2**-10) for y = x / scale within +-448 (3 mantissa bits: relative 2**-4 for
            normal values, half the subnormal step 2**-9 below 2**-6), plus the saturation |y| - 448 beyond."""
    check_kv_format(kv_format)
    xf = x.float()
    slack = 1 + 2.0**-12
    if kv_format == "auto":
        return torch.zeros_like(xf)
    if kv_format == "int8":
        return (scales.float() / 2 * slack)[..., None].expand_as(xf)
    if kv_format == "int4":
        groups = xf.unflatten(-1, (-1, INT4_GROUP))
        scale, zero = scales.float()[..., 0], scales.float()[..., 1]
        bound = scale / 2 * slack + (groups.amin(dim=-1) - zero).abs()
        return (bound[..., None] + groups.abs() * 2.0**-23).expand_as(groups).flatten(-2)
    scale = scales.float()[:, None]
    y = (xf / scale).abs()
    step = torch.maximum(y * 2.0**-4, torch.full_like(y, 2.0**-10))
    return scale * (step * slack + (y - FP8_MAX).clamp_min(0))
