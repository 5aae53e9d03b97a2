"""Test helpers for quantized KV caches: a random paged cache stored in a quantized format, poisoned where unused.

Why it exists: the quantized-kernel tests (and the per-format benchmark) compare a kernel reading a quantized cache
with the float reference reading ``dequantize_kv`` of the same cache, so both need the same inputs: random keys and
values quantized by the reference, in shuffled blocks, with every slot the sequences do not own poisoned so that a
wrong read shows up as NaN. Integer codes have no NaN, so there the per-slot scales are NaN and the codes random
bytes; fp8 has a NaN code (0x7F), so unused fp8 slots hold it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kernel_testing import PagedKV, random_paged_kv

from workbench_kernels.kv_quant import FP8_MAX, dequantize_kv, quantize_kv

FP8_NAN_BYTE = 0x7F


@dataclass
class QuantizedPagedKV:
    """A paged cache in ``kv_format`` with its scales; ``float_twin`` keeps the values before quantization."""

    kv_format: str
    key_cache: torch.Tensor  # layouts as in kv_quant.cache_shapes
    value_cache: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    float_twin: PagedKV

    def format_args(self) -> dict:
        """The keywords the kernels take for this cache."""
        return {"kv_format": self.kv_format, "k_scale": self.k_scale, "v_scale": self.v_scale}

    def dequantized(self, dtype: torch.dtype) -> PagedKV:
        """The float cache the kernels see after dequantizing (NaN wherever poisoned)."""
        caches = [dequantize_kv(c.cpu(), s.cpu(), self.kv_format, dtype)
                  for c, s in ((self.key_cache, self.k_scale), (self.value_cache, self.v_scale))]
        return PagedKV(*caches, self.block_tables.cpu(), self.context_lens.cpu())


def fp8_scales_for(cache: torch.Tensor, headroom: float = 1.25) -> torch.Tensor:
    """Per-KV-head float32 scales mapping the largest finite |value| to 448 / ``headroom``, as calibration would."""
    amax = cache.float().nan_to_num(0.0).abs().amax(dim=(0, 1, 3))
    return (amax * headroom / FP8_MAX).clamp_min(2.0**-14).contiguous()


def _quantize_cache(cache: torch.Tensor, used: torch.Tensor, kv_format: str, fp8_scale, gen: torch.Generator):
    """``cache`` quantized in the used slots; unused slots hold random codes and NaN scales (fp8: NaN codes)."""
    data, scales = quantize_kv(cache[:1, :1], kv_format, fp8_scale)  # only for the layout's shapes and dtypes
    data_shape, scale_shape = (*cache.shape[:3], data.shape[-1]), (*cache.shape[:3], *scales.shape[3:])
    stored = torch.randint(0, 256, data_shape, generator=gen, dtype=torch.uint8)
    if kv_format == "fp8_e4m3":
        stored.fill_(FP8_NAN_BYTE)
        all_scales = fp8_scale
    else:
        all_scales = torch.full(scale_shape, float("nan"), dtype=scales.dtype)
    stored = stored.view(data.dtype)
    data, scales = quantize_kv(cache[used], kv_format, fp8_scale)
    stored.view(torch.uint8)[used] = data.view(torch.uint8)
    if kv_format != "fp8_e4m3":
        all_scales[used] = scales
    return stored, all_scales


def random_quantized_paged_kv(context_lens: list[int], kv_format: str, *, num_kv_heads: int, head_dim: int,
                              block_size: int, seed: int, device: str | torch.device = "cpu") -> QuantizedPagedKV:
    """Random keys/values (as ``testing.random_paged_kv``, float32) quantized into ``kv_format``; fp8 scales are
    calibrated per KV head, and each KV head's values get their own magnitude so that a head mix-up shows."""
    gen = torch.Generator().manual_seed(seed + 1000)
    twin = random_paged_kv(context_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
                           dtype=torch.float32, seed=seed)
    magnitudes = torch.exp(torch.randn(num_kv_heads, generator=gen))[:, None]
    twin.key_cache *= magnitudes
    twin.value_cache *= magnitudes
    used = ~twin.key_cache[:, :, 0, 0].isnan()
    quantized = []
    for cache in (twin.key_cache, twin.value_cache):
        fp8_scale = fp8_scales_for(cache) if kv_format == "fp8_e4m3" else None
        quantized.append(_quantize_cache(cache, used, kv_format, fp8_scale, gen))
    (k, ks), (v, vs) = quantized
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    return QuantizedPagedKV(kv_format, move(k), move(v), move(ks), move(vs), move(twin.block_tables),
                            move(twin.context_lens), twin)
