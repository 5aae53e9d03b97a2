"""Triton pieces of the quantized KV formats: quantize a head vector on write, dequantize a key/value tile on read.

Why it exists: ``store_kv`` and both attention kernels must reproduce ``kv_quant``'s PyTorch definitions bit for
bit, on CUDA and under the CPU interpreter alike, so the arithmetic lives in one place and avoids the operations
whose rounding differs between the two:

- fp32 ``/`` compiles to an approximate division on CUDA (``div.full.f32``, up to 2 ulp off): ``div_rn`` instead.
  ``div_rn`` does not broadcast on CUDA, so the divisor is widened to the dividend's shape first.
- casts to fp8 are wrong under the interpreter (measured with triton 3.9: 125.9 -> 64, 1.0625 -> 1.125, 464 -> NaN)
  and its fp8 loads read 0x7F as 480 instead of NaN: e4m3 bits are encoded and decoded with integer arithmetic on
  ``uint8`` views, which is exact on both.
- round-half-to-even uses the float32 "magic number" add instead of a libdevice call whose path moved between
  Triton versions.

Format codes (the ``KV_FORMAT`` constexpr; jit code compares against the literals): 0 auto, 1 fp8_e4m3, 2 int8,
3 int4.
"""

from __future__ import annotations

import os

from ._common import tl, triton

KV_FORMAT_CODES = {"auto": 0, "fp8_e4m3": 1, "int8": 2, "int4": 3}

# On a GPU, fp8 codes are decoded by the hardware's conversion (one instruction per pair) rather than by the
# integer arithmetic the interpreter needs: on an H100 the integer decode made fp8 decode attention 1.26x slower
# than bf16 instead of faster (bench_gpu_kernels, 2026-11-23). Both read 0x7F / 0xFF as NaN.
_NATIVE_FP8 = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


@triton.jit
def _div_rn(x, y):
    """IEEE (round-to-nearest) x / y, with y a scalar or x's shape."""
    return tl.math.div_rn(x, tl.zeros_like(x) + y)


@triton.jit
def _round_half_even(v):
    # For |v| < 2**22, v + 1.5 * 2**23 keeps no fraction bits, so the float32 add itself rounds half to even (as
    # torch.round does). No contraction into an FMA can change it: v is a quotient or an exact product.
    return (v + 12582912.0) - 12582912.0


@triton.jit
def _fp8_e4m3_encode(y):
    """float32 ``y`` within [-448, 448] -> float8_e4m3fn bits (uint8), rounded to nearest even like torch's cast."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    # Normal range (|y| >= 2**-6, float32 bits 0x3C800000): round 23 mantissa bits to 3, half to even (a carry into
    # the exponent is correct), then rebias the exponent from 127 to 7: 120 << 3 in the shifted bits.
    rounded = mag + 0x7FFFF + ((mag >> 20) & 1)
    normal = (rounded >> 20) - (120 << 3)
    # Subnormal range: multiples of 2**-9. A value that rounds up to 8 * 2**-9 = 2**-6 gets code 8, which is
    # exactly the smallest normal's encoding, so the two ranges join without a special case.
    subnormal = _round_half_even(tl.abs(y) * 512.0).to(tl.int32)
    code = tl.where(mag >= 0x3C800000, normal, subnormal)
    code = tl.where(mag > 0x7F800000, 0x7F, code)  # NaN stays NaN, as in torch
    return (code | sign).to(tl.uint8)


@triton.jit
def _fp8_e4m3_decode(bits):
    """float8_e4m3fn bits (uint8) -> float32. Placed in a float16's bit pattern, an e4m3 value (exponent bias 7,
    3 mantissa bits) reads as a float16 (bias 15) times 2**-8, subnormals included; 0x7F / 0xFF are NaN."""
    b = bits.to(tl.int32)
    half_bits = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
    value = half_bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    return tl.where((b & 0x7F) == 0x7F, float("nan"), value)


@triton.jit
def _int8_to_float32(codes):
    """int8 codes -> float32 exactly, with an integer add and a float subtract: 2**23 + 128 + c has c + 128 in
    its low mantissa bits. The direct int-to-float conversion runs at a quarter of the ALU rate on Hopper and
    was the bottleneck of int8 decode attention (1.04x bf16's time for half the bytes)."""
    biased = codes.to(tl.int32) + 0x4B000080
    return biased.to(tl.float32, bitcast=True) - 8388736.0


@triton.jit
def _quantize_fp8(x, dst_ptr, scale_ptr, head, d, d_mask):
    """Store the float32 head vector ``x [BLOCK_D]`` as e4m3 bits using the static per-head scale."""
    y = _div_rn(x, tl.load(scale_ptr + head))
    y = tl.where(y == y, tl.minimum(tl.maximum(y, -448.0), 448.0), y)  # CUDA's min/max would turn NaN into 448
    tl.store(dst_ptr + d, _fp8_e4m3_encode(y), mask=d_mask)


@triton.jit
def _quantize_int8(x, dst_ptr, scale_ptr, d, d_mask):
    """Store ``x [BLOCK_D]`` (float32, 0 in padded lanes) as int8 codes and write its float16 scale."""
    amax = tl.max(tl.abs(x), axis=0)
    scale = tl.maximum(_div_rn(amax, 127.0), 2.0**-14).to(tl.float16)  # floor: smallest normal float16
    codes = _round_half_even(_div_rn(x, scale.to(tl.float32)))
    codes = tl.minimum(tl.maximum(codes, -127.0), 127.0)  # after rounding == before: the bounds are integers
    tl.store(dst_ptr + d, codes.to(tl.int8), mask=d_mask)
    tl.store(scale_ptr, scale)


@triton.jit
def _int4_codes(x, zero, scale):
    return tl.minimum(tl.maximum(_round_half_even(_div_rn(x - zero, scale)), 0.0), 15.0).to(tl.int32)


@triton.jit
def _quantize_int4(src_ptr, dst_ptr, scale_ptr, stride_sg, GROUPS: tl.constexpr, BLOCK_GROUPS: tl.constexpr):
    """Quantize one head vector (``GROUPS`` groups of 32 at ``src_ptr``, unit stride) into 16 bytes per group and
    write each group's float16 (scale, zero). Even and odd elements are loaded apart: they are the two nibbles."""
    g = tl.arange(0, BLOCK_GROUPS)
    j = tl.arange(0, 16)
    mask = (g < GROUPS)[:, None] & (j < 16)[None, :]
    even_offsets = g[:, None] * 32 + 2 * j[None, :]
    even = tl.load(src_ptr + even_offsets, mask=mask, other=0.0).to(tl.float32)
    odd = tl.load(src_ptr + even_offsets + 1, mask=mask, other=0.0).to(tl.float32)
    lo = tl.minimum(tl.min(even, axis=1), tl.min(odd, axis=1))
    hi = tl.maximum(tl.max(even, axis=1), tl.max(odd, axis=1))
    scale = tl.maximum(_div_rn(hi - lo, 15.0), 2.0**-14).to(tl.float16)
    zero = lo.to(tl.float16)
    scale32 = (scale.to(tl.float32))[:, None]
    zero32 = (zero.to(tl.float32))[:, None]
    packed = _int4_codes(even, zero32, scale32) | (_int4_codes(odd, zero32, scale32) << 4)
    tl.store(dst_ptr + g[:, None] * 16 + j[None, :], packed.to(tl.uint8), mask=mask)
    tl.store(scale_ptr + g * stride_sg, scale, mask=g < GROUPS)
    tl.store(scale_ptr + g * stride_sg + 1, zero, mask=g < GROUPS)


@triton.jit
def _dequantize_tile(
    cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim (int4: head_dim // 2)] uint8 / int8 codes
    scale_ptr,  # fp8: [num_kv_heads] float32; int8: [..., num_kv_heads] fp16; int4: [..., head_dim // 32, 2] fp16
    rows,  # [TILE] int64: offset of each key's head vector in the cache
    scale_rows,  # [TILE] int64: offset of each key's scales (int8 / int4)
    kv_head,
    d,  # [BLOCK_D] int32: head_dim lanes
    t_mask,  # [TILE] bool: keys that exist
    d_mask,  # [BLOCK_D] bool: lanes inside head_dim
    stride_sg,  # int4 scales: group stride
    KV_FORMAT: tl.constexpr,
):
    """A quantized tile ``[TILE, BLOCK_D]`` dequantized to float32; masked entries are 0 (codes and scales 0)."""
    mask = t_mask[:, None] & d_mask[None, :]
    if KV_FORMAT == 1:  # fp8_e4m3
        bits = tl.load(cache_ptr + rows[:, None] + d[None, :], mask=mask, other=0)
        if _NATIVE_FP8:  # noqa: SIM108 (a static branch on a constexpr)
            values = bits.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            values = _fp8_e4m3_decode(bits)
        tile = values * tl.load(scale_ptr + kv_head)
    elif KV_FORMAT == 2:  # int8
        codes = tl.load(cache_ptr + rows[:, None] + d[None, :], mask=mask, other=0)
        scale = tl.load(scale_ptr + scale_rows, mask=t_mask, other=0.0).to(tl.float32)
        tile = _int8_to_float32(codes) * scale[:, None]
    else:  # int4: each byte is read by its two lanes, which keep their own nibble
        packed = tl.load(cache_ptr + rows[:, None] + (d // 2)[None, :], mask=mask, other=0).to(tl.int32)
        codes = (packed >> ((d % 2) * 4)[None, :]) & 0xF
        group = scale_ptr + scale_rows[:, None] + ((d // 32) * stride_sg)[None, :]
        scale = tl.load(group, mask=mask, other=0.0).to(tl.float32)
        zero = tl.load(group + 1, mask=mask, other=0.0).to(tl.float32)
        tile = codes.to(tl.float32) * scale + zero  # q * scale is exact, so an FMA rounds like the reference
    return tile
