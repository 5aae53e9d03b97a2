"""Quantized KV formats: the kv_quant references (round trips within each format's bound, int4 packing, slot sizes
that match what is allocated), and quantize-on-write in store_kv, where the Triton kernel (interpreter on CPU, or
CUDA) must write the reference's bytes and scales exactly. Attention over quantized caches is in
test_kernel_quant_attention.py."""

from __future__ import annotations

import pytest
import torch
from kernel_testing_quant import FP8_NAN_BYTE, fp8_scales_for

from workbench_kernels.kv_quant import (
    allocate_cache,
    cache_shapes,
    dequantize_kv,
    pack_int4,
    quantize_kv,
    roundtrip_error_bound,
    slot_bytes,
    unpack_int4,
)
from workbench_kernels.store_kv import store_kv, store_kv_reference, store_kv_triton

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
FORMATS = ["fp8_e4m3", "int8", "int4"]


def _varied_vectors(seed: int, num_tokens: int = 24, num_kv_heads: int = 3, head_dim: int = 64) -> torch.Tensor:
    """Head vectors whose magnitudes span 1e-6..3e4 (float16's range bounds the int scales), plus special ones:
    a constant vector, a constant negative one, all zeros, one large outlier among small values."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((num_tokens, num_kv_heads, head_dim), generator=gen)
    magnitude = torch.logspace(-6, 4, num_tokens)[torch.randperm(num_tokens, generator=gen)]
    x = x * magnitude[:, None, None]
    x[0, 0], x[0, 1], x[0, 2] = 0.37, -1234.5, 0.0
    x[1, 0] = torch.randn(head_dim, generator=gen) * 1e-3
    x[1, 0, 5] = 300.0
    return x.clamp(-3e4, 3e4)


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("seed", [0, 1])
def test_roundtrip_error_within_the_format_bound(kv_format, seed):
    x = _varied_vectors(seed)
    fp8_scale = fp8_scales_for(x[None]) if kv_format == "fp8_e4m3" else None
    data, scales = quantize_kv(x, kv_format, fp8_scale)
    err = (dequantize_kv(data, scales, kv_format, torch.float32) - x).abs()
    bound = roundtrip_error_bound(x, scales, kv_format)
    worst = (err / bound).nan_to_num(0.0)
    assert bool((err <= bound).all()), f"{kv_format}: error {err.max():.3e} beyond its bound, ratio {worst.max():.3f}"
    assert float(worst.max()) > 0.3  # the bound is a real one, not a loose guess (measured 0.5..1.0)
    assert not dequantize_kv(data, scales, kv_format).isnan().any()


def test_int8_and_int4_specifics():
    x = _varied_vectors(2)
    codes, scales = quantize_kv(x, "int8")
    assert codes.dtype == torch.int8 and int(codes.abs().max()) == 127 and scales.dtype == torch.float16
    assert float(scales.float().min()) == 2.0**-14  # the all-zero vector: floored scale, codes 0
    packed, groups = quantize_kv(x, "int4")
    assert packed.shape == (*x.shape[:2], x.shape[2] // 2) and groups.shape == (*x.shape[:2], 2, 2)
    assert int(unpack_int4(packed).max()) == 15 and int(unpack_int4(packed).min()) == 0


def test_int4_pack_unpack_is_exact():
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (5, 3, 64), generator=gen, dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(codes)), codes)
    assert pack_int4(torch.tensor([1, 2, 15, 0])).tolist() == [0x21, 0x0F]  # element 2i in the low nibble


@pytest.mark.parametrize("kv_format", ["auto", *FORMATS])
def test_slot_bytes_are_what_an_allocated_cache_holds(kv_format):
    """The sizing code (`workbench.cache.sizing`) counts slot_bytes; it must be what allocate_cache really holds
    per slot (hand arithmetic per format is in test_sizing.py). fp8's static per-head scales are not per slot."""
    num_blocks, block_size, heads, head_dim = 7, 16, 3, 128
    data, scales = allocate_cache(kv_format, num_blocks, block_size, heads, head_dim, torch.bfloat16)
    held = data.numel() * data.element_size()
    if cache_shapes(kv_format, 1, 1, heads, head_dim)["scale_per_slot"]:
        held += scales.numel() * scales.element_size()
    assert data.shape[:3] == (num_blocks, block_size, heads)
    assert held == num_blocks * block_size * slot_bytes(kv_format, heads, head_dim, torch.bfloat16)


def _fp8_edge_values() -> torch.Tensor:
    """Every finite e4m3 value, every midpoint between neighbours (ties: round to even), and 1 ulp either side."""
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    positive = values[values >= 0].unique().sort().values
    mids = (positive[1:] + positive[:-1]) / 2
    nudge = lambda t, k: (t.view(torch.int32) + k).view(torch.float32)  # noqa: E731
    edges = torch.cat([values[~values.isnan()], mids, nudge(mids, 1), nudge(mids, -1)])
    return torch.cat([edges, -edges, torch.tensor([448.0, -448.0, 460.0, 1e-30])])


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_encoding_rounds_like_torch(device):
    """The kernel's integer e4m3 encoder against torch's cast on every rounding edge (scale 1, through store_kv)."""
    values = _fp8_edge_values()
    head_dim = 64
    values = torch.cat([values, values[: -values.numel() % head_dim]])
    key = values.view(-1, 1, head_dim).to(device)
    cache = torch.empty((key.shape[0], 1, 1, head_dim), dtype=torch.float8_e4m3fn, device=device)
    scale = torch.ones(1, device=device)
    slots = torch.arange(key.shape[0], device=device)
    store_kv_triton(key, key, cache, cache.clone(), slots, kv_format="fp8_e4m3", k_scale=scale, v_scale=scale)
    expected = values.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    got = cache.cpu().view(torch.uint8).flatten()
    bad = (got != expected).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} mismatches, e.g. {values[bad[:5]].tolist()} -> {got[bad[:5]].tolist()}"


def _store_case(kv_format, dtype, device, *, num_tokens=13, num_kv_heads=3, head_dim=64, block_size=16,
                num_blocks=6, seed=0):
    """Poisoned quantized caches (random codes, NaN scales; fp8 NaN codes), random K/V, every third slot -1."""
    gen = torch.Generator().manual_seed(seed)
    layout = cache_shapes(kv_format, num_blocks, block_size, num_kv_heads, head_dim, dtype)
    caches = [torch.randint(0, 256, layout["data_shape"], generator=gen, dtype=torch.uint8) for _ in range(2)]
    if kv_format == "fp8_e4m3":
        caches = [c.fill_(FP8_NAN_BYTE) for c in caches]
    caches = [c.view(layout["data_dtype"]) if c.element_size() == 1 else c for c in caches]
    if kv_format == "auto":
        caches = [torch.full(layout["data_shape"], float("nan"), dtype=dtype) for _ in range(2)]
    scales = [None, None]
    if kv_format == "fp8_e4m3":
        scales = [torch.rand(num_kv_heads, generator=gen) * 0.05 + 0.001 for _ in range(2)]
    elif kv_format != "auto":
        scales = [torch.full(layout["scale_shape"], float("nan"), dtype=torch.float16) for _ in range(2)]
    key = (torch.randn((num_tokens, num_kv_heads, head_dim), generator=gen) * 3).to(dtype)
    value = torch.randn((num_tokens, num_kv_heads, head_dim), generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::3] = -1
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    return move(key), move(value), [move(c) for c in caches], [move(s) for s in scales], move(slots)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("num_kv_heads", "head_dim"), [(3, 64), (2, 128)])
def test_store_kernel_writes_the_reference_bytes_and_scales(device, kv_format, dtype, num_kv_heads, head_dim):
    key, value, caches, scales, slots = _store_case(kv_format, dtype, device, num_kv_heads=num_kv_heads,
                                                    head_dim=head_dim)
    expected_caches = [c.cpu().clone() for c in caches]
    expected_scales = [None if s is None else s.cpu().clone() for s in scales]
    store_kv_reference(key.cpu(), value.cpu(), *expected_caches, slots.cpu(), kv_format=kv_format,
                       k_scale=expected_scales[0], v_scale=expected_scales[1])
    store_kv_triton(key, value, *caches, slots, kv_format=kv_format, k_scale=scales[0], v_scale=scales[1])
    for got, expected in zip([*caches, *scales], [*expected_caches, *expected_scales], strict=True):
        assert torch.equal(_bytes(got), _bytes(expected))


@pytest.mark.parametrize("kv_format", FORMATS)
def test_store_touches_only_listed_slots(kv_format):
    key, value, caches, scales, slots = _store_case(kv_format, torch.float16, "cpu")
    before = [_bytes(t).clone() for t in (*caches, *scales)]
    store_kv(key, value, *caches, slots, kv_format=kv_format, k_scale=scales[0], v_scale=scales[1])
    written = torch.zeros(caches[0].shape[:2], dtype=torch.bool)
    written.view(-1)[slots[slots >= 0]] = True
    for old, new in zip(before[:2], caches, strict=True):
        assert torch.equal(_bytes(new)[~written], old[~written]) and not torch.equal(_bytes(new)[written], old[written])
    if kv_format != "fp8_e4m3":  # per-slot scales: written exactly where the data is
        for new in scales:
            assert new[~written].isnan().all() and not new[written].isnan().any()
    else:  # static scales are inputs: untouched
        assert torch.equal(_bytes(scales[0]), before[2]) and torch.equal(_bytes(scales[1]), before[3])


def test_int8_store_on_head_dim_80():
    """int8 has no grouping: a head_dim that is not a power of two is padded and masked (the amax ignores padding)."""
    key, value, caches, scales, slots = _store_case("int8", torch.float32, "cpu", head_dim=80)
    expected = [t.clone() for t in (*caches, *scales)]
    store_kv_reference(key, value, *expected[:2], slots, kv_format="int8", k_scale=expected[2], v_scale=expected[3])
    store_kv_triton(key, value, *caches, slots, kv_format="int8", k_scale=scales[0], v_scale=scales[1])
    for got, want in zip((*caches, *scales), expected, strict=True):
        assert torch.equal(_bytes(got), _bytes(want))
