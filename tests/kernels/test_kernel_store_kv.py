"""store_kv: the Triton kernel writes exactly the reference's slots (under the interpreter on CPU, or on CUDA)."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import check_large_block_ids_in_subprocess

from workbench_kernels.store_kv import store_kv, store_kv_reference, store_kv_triton

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(device, dtype, *, num_tokens=13, num_kv_heads=3, head_dim=64, block_size=16, num_blocks=6,
            slot_dtype=torch.int64, seed=0):
    """NaN caches, random K/V, distinct random slots with every third token marked -1 (padding)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(shape, float("nan"), dtype=dtype)
    value_cache = torch.full(shape, float("nan"), dtype=dtype)
    key = torch.randn((num_tokens, num_kv_heads, head_dim), generator=gen).to(dtype)
    value = torch.randn((num_tokens, num_kv_heads, head_dim), generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::3] = -1
    tensors = key, value, key_cache, value_cache, slots.to(slot_dtype)
    return [t.to(device) for t in tensors]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality, so NaN == NaN: the cache must be a byte-exact copy of the reference's."""
    return torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))


def _run_both(device, dtype, **shape):
    key, value, key_cache, value_cache, slots = _inputs(device, dtype, **shape)
    expected_k, expected_v = key_cache.cpu().clone(), value_cache.cpu().clone()
    store_kv_reference(key.cpu(), value.cpu(), expected_k, expected_v, slots.cpu())
    store_kv_triton(key, value, key_cache, value_cache, slots)
    return (key_cache, value_cache), (expected_k, expected_v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_kv_heads", "head_dim", "block_size"), [(3, 64, 16), (2, 128, 8), (1, 80, 32)])
def test_kernel_writes_the_reference_slots(device, dtype, num_kv_heads, head_dim, block_size):
    got, expected = _run_both(device, dtype, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size)
    assert _same_bits(got[0], expected[0]) and _same_bits(got[1], expected[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_padding_slots_and_unlisted_slots_stay_untouched(device, slot_dtype):
    key, value, key_cache, value_cache, slots = _inputs(device, torch.float16, slot_dtype=slot_dtype)
    store_kv_triton(key, value, key_cache, value_cache, slots)
    block_size = key_cache.shape[1]
    written = torch.zeros(key_cache.shape[:2], dtype=torch.bool)
    kept = slots.cpu() >= 0
    written.view(-1)[slots.cpu()[kept].long()] = True
    for cache, source in ((key_cache.cpu(), key.cpu()), (value_cache.cpu(), value.cpu())):
        assert cache[~written].isnan().all(), "a slot not in slot_mapping (or marked -1) was written"
        kept_slots = slots.cpu()[kept].long()
        assert torch.equal(cache[kept_slots // block_size, kept_slots % block_size], source[kept])
    assert int((~kept).sum()) > 0  # the inputs do contain padding tokens


@pytest.mark.parametrize("device", DEVICES)
def test_key_and_value_may_be_views_of_a_fused_projection(device):
    key, value, key_cache, value_cache, slots = _inputs(device, torch.float32, num_kv_heads=2, head_dim=64)
    fused = torch.randn((key.shape[0], 6, 64), device=device)  # q (2 heads) | k | v, as one projection's output
    key, value = fused[:, 2:4], fused[:, 4:6]
    expected_k, expected_v = key_cache.cpu().clone(), value_cache.cpu().clone()
    store_kv_reference(key.cpu(), value.cpu(), expected_k, expected_v, slots.cpu())
    store_kv_triton(key, value, key_cache, value_cache, slots)
    assert _same_bits(key_cache, expected_k) and _same_bits(value_cache, expected_v)


def test_public_function_on_cpu_runs_the_reference():
    key, value, key_cache, value_cache, slots = _inputs("cpu", torch.float32)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    store_kv_reference(key, value, expected_k, expected_v, slots)
    store_kv(key, value, key_cache, value_cache, slots)
    assert _same_bits(key_cache, expected_k) and _same_bits(value_cache, expected_v)


def _bad(case: str):
    key, value, key_cache, value_cache, slots = _inputs("cpu", torch.float32)
    args = {"key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache, "slot_mapping": slots}
    changes = {
        "key 2-D": {"key": key[:, 0]},
        "value dtype": {"value": value.half()},
        "value shape": {"value": value[:-1]},
        "cache dtype": {"key_cache": key_cache.half(), "value_cache": value_cache.half()},
        "cache heads": {"key_cache": key_cache[:, :, :2], "value_cache": value_cache[:, :, :2]},
        "caches differ": {"value_cache": value_cache[:-1]},
        "slot dtype": {"slot_mapping": slots.float()},
        "slot count": {"slot_mapping": slots[:-1]},
        "slot device": {"slot_mapping": slots.to("meta")},
        "key last stride": {"key": key.transpose(1, 2).contiguous().transpose(1, 2)},
    }
    args.update(changes[case])
    return args


@pytest.mark.parametrize(("case", "message"), [
    ("key 2-D", "key must have 3 dimensions"),
    ("value dtype", "value has dtype torch.float16"),
    ("value shape", "value shape"),
    ("cache dtype", "with kv_format .auto. the cache must hold the activations. dtype"),
    ("cache heads", r"key_cache.shape\[2\] is 2 but must equal num_kv_heads \(3\)"),
    ("caches differ", "must match"),
    ("slot dtype", "slot_mapping has dtype torch.float32"),
    ("slot count", r"slot_mapping.shape\[0\] is 12"),
    ("slot device", "slot_mapping is on meta"),
    ("key last stride", "key must have stride 1 in its last dimension"),
])
def test_launcher_rejects_bad_arguments(case, message):
    with pytest.raises(ValueError, match=message):
        store_kv_triton(**_bad(case))


@pytest.mark.parametrize("device", DEVICES)
def test_slots_past_2_31_elements(device):
    """Block ids whose offsets pass 2**31 elements (a ~4.3 GiB float16 cache, lazily backed, top blocks used).

    Run in a subprocess: under the interpreter an int32 offset wraps negative and the write lands outside the
    cache, which crashes the process (SIGSEGV) instead of failing an assert; reverting the kernel's int64 casts
    made this test fail that way."""
    check_large_block_ids_in_subprocess("store_kv", device)
