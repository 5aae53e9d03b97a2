"""Paged decode and prefill attention over quantized KV caches (fp8_e4m3, int8, int4): the Triton kernels
(interpreter on CPU, or CUDA) against the float reference fed the dequantized cache, at each dtype's usual
tolerance; the quantized references against the same; launcher validation. Slots the sequences do not own hold
NaN codes (fp8) or NaN scales and random codes (int8/int4), and outputs start as NaN."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import (
    DECODE_CONTEXT_LENS,
    GQA_RATIOS,
    MIXED_STEP_CONTEXT_LENS,
    MIXED_STEP_QUERY_LENS,
    assert_close,
    poisoned_like,
    query_start_loc,
    random_queries,
    upcast,
)
from kernel_testing_quant import random_quantized_paged_kv

from workbench_kernels.kv_quant import allocate_cache
from workbench_kernels.paged_decode_attention import (
    paged_decode_attention,
    paged_decode_attention_reference,
    paged_decode_attention_triton,
)
from workbench_kernels.paged_prefill_attention import (
    paged_prefill_attention,
    paged_prefill_attention_reference,
    paged_prefill_attention_triton,
)
from workbench_kernels.store_kv import store_kv_reference, store_kv_triton

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
FORMATS = ["fp8_e4m3", "int8", "int4"]


def _case(device, kv_format, dtype, num_heads, num_kv_heads, head_dim, num_queries, context_lens, seed=0):
    qkv = random_quantized_paged_kv(context_lens, kv_format, num_kv_heads=num_kv_heads, head_dim=head_dim,
                                    block_size=16, seed=seed, device=device)
    query = random_queries(num_queries, num_heads, head_dim, dtype, seed=seed + 1, device=device)
    return query, qkv, head_dim**-0.5


def _decode_expected(query, qkv, scale):
    """The float reference in float32 on the dequantized cache (dequantized in the query's dtype, as the kernel)."""
    deq = qkv.dequantized(query.dtype)
    q, k, v = upcast(query.cpu(), deq.key_cache, deq.value_cache)
    return paged_decode_attention_reference(q, k, v, deq.block_tables, deq.context_lens, scale)


def _prefill_expected(query, qkv, starts, scale):
    deq = qkv.dequantized(query.dtype)
    q, k, v = upcast(query.cpu(), deq.key_cache, deq.value_cache)
    return paged_prefill_attention_reference(q, k, v, deq.block_tables, starts.cpu(), deq.context_lens, scale)


def _check_decode(device, kv_format, dtype, num_heads, num_kv_heads, head_dim=64, **knobs):
    query, qkv, scale = _case(device, kv_format, dtype, num_heads, num_kv_heads, head_dim, len(DECODE_CONTEXT_LENS),
                              DECODE_CONTEXT_LENS)
    out = paged_decode_attention_triton(query, qkv.key_cache, qkv.value_cache, qkv.block_tables, qkv.context_lens,
                                        scale, out=poisoned_like(query), **qkv.format_args(), **knobs)
    assert_close(out, _decode_expected(query, qkv, scale), dtype, what=f"decode {kv_format}")


def _check_prefill(device, kv_format, dtype, num_heads, num_kv_heads, head_dim=64):
    query, qkv, scale = _case(device, kv_format, dtype, num_heads, num_kv_heads, head_dim, sum(MIXED_STEP_QUERY_LENS),
                              MIXED_STEP_CONTEXT_LENS)
    starts = query_start_loc(MIXED_STEP_QUERY_LENS, device)
    out = paged_prefill_attention_triton(query, qkv.key_cache, qkv.value_cache, qkv.block_tables, starts,
                                         qkv.context_lens, scale, out=poisoned_like(query), **qkv.format_args())
    assert_close(out, _prefill_expected(query, qkv, starts, scale), dtype, what=f"prefill {kv_format}")


CHECKS = {"decode": _check_decode, "prefill": _check_prefill}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), GQA_RATIOS)
def test_kernel_for_gqa_ratios(device, kv_format, kernel, num_heads, num_kv_heads):
    """Decode rows, and prefill's mixed step of decode rows, whole prompts and chunks after a cached prefix."""
    CHECKS[kernel](device, kv_format, torch.float32, num_heads, num_kv_heads)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize(("kernel", "dtype", "gqa"), [
    ("decode", torch.float16, (8, 2)), ("decode", torch.bfloat16, (9, 3)),
    ("prefill", torch.float16, (8, 2)), ("prefill", torch.bfloat16, (5, 1)),
])
def test_kernel_head_dim_128_low_precision(device, kv_format, kernel, dtype, gqa):
    CHECKS[kernel](device, kv_format, dtype, *gqa, 128)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_format", FORMATS)
def test_decode_kernel_with_splits_and_small_tiles(device, kv_format):
    _check_decode(device, kv_format, torch.float32, 9, 3, tile_size=16, num_splits=3)


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("prefill,decode", [(paged_prefill_attention_reference, paged_decode_attention_reference),
                                            (paged_prefill_attention, paged_decode_attention)])
def test_cpu_functions_read_quantized_caches_as_their_dequantized_twins(kv_format, prefill, decode):
    """The references, and what the CPU engine runs (the public functions' fast CPU paths): given the quantized
    cache they equal the reference on the dequantized one."""
    query, qkv, scale = _case("cpu", kv_format, torch.float32, 9, 3, 64, sum(MIXED_STEP_QUERY_LENS),
                              MIXED_STEP_CONTEXT_LENS)
    starts = query_start_loc(MIXED_STEP_QUERY_LENS)
    got = prefill(query, qkv.key_cache, qkv.value_cache, qkv.block_tables, starts, qkv.context_lens, scale,
                  **qkv.format_args())
    assert_close(got, _prefill_expected(query, qkv, starts, scale), torch.float32)
    decode_query = query[:len(MIXED_STEP_CONTEXT_LENS)]
    got = decode(decode_query, qkv.key_cache, qkv.value_cache, qkv.block_tables, qkv.context_lens, scale,
                 **qkv.format_args())
    assert_close(got, _decode_expected(decode_query, qkv, scale), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_format", FORMATS)
def test_store_then_attend(device, kv_format):
    """Keys written by the store kernel and read by the decode kernel, against the references doing both."""
    num_kv_heads, head_dim, block_size, context = 2, 64, 16, [23, 40]
    gen = torch.Generator().manual_seed(5)
    table = torch.randperm(8, generator=gen)[:6].view(2, 3).int()
    slots = torch.cat([table[b].long().repeat_interleave(block_size)[:n] * block_size
                       + torch.arange(n) % block_size for b, n in enumerate(context)])
    key, value = (torch.randn((len(slots), num_kv_heads, head_dim), generator=gen) for _ in range(2))
    query = random_queries(2, 8, head_dim, torch.float32, seed=6)
    outs = []
    for store, attend, dev in ((store_kv_triton, paged_decode_attention_triton, device),
                               (store_kv_reference, paged_decode_attention_reference, "cpu")):
        (kc, ks), (vc, vs) = (allocate_cache(kv_format, 8, block_size, num_kv_heads, head_dim, device=dev)
                              for _ in range(2))
        if kv_format == "fp8_e4m3":
            ks, vs = torch.full_like(ks, 0.01), torch.full_like(vs, 0.005)
        fmt = {"kv_format": kv_format, "k_scale": ks, "v_scale": vs}
        store(key.to(dev), value.to(dev), kc, vc, slots.to(dev), **fmt)
        outs.append(attend(query.to(dev), kc, vc, table.to(dev), torch.tensor(context, device=dev).int(), 0.125,
                           **fmt))
    assert_close(outs[0], outs[1], torch.float32, what=f"store+decode {kv_format}")


def _bad(case: str):
    query, qkv, scale = _case("cpu", "int8", torch.float32, 9, 3, 64, len(DECODE_CONTEXT_LENS), DECODE_CONTEXT_LENS)
    args = {"query": query, "key_cache": qkv.key_cache, "value_cache": qkv.value_cache,
            "block_tables": qkv.block_tables, "context_lens": qkv.context_lens, "scale": scale, **qkv.format_args()}
    int4_data = torch.zeros((*qkv.key_cache.shape[:3], 32), dtype=torch.uint8)
    changes = {
        "unknown format": {"kv_format": "fp8"},
        "cache dtype": {"key_cache": qkv.key_cache.view(torch.uint8), "value_cache": qkv.value_cache.view(torch.uint8)},
        "missing scale": {"v_scale": None},
        "scale ndim": {"k_scale": qkv.k_scale[..., 0]},
        "scale shape": {"k_scale": qkv.k_scale[:-1]},
        "scale dtype": {"k_scale": qkv.k_scale.float()},
        "scales with auto": {"kv_format": "auto", "key_cache": qkv.float_twin.key_cache,
                             "value_cache": qkv.float_twin.value_cache},
        "fp8 without scales": {"kv_format": "fp8_e4m3", "k_scale": None, "v_scale": None,
                               "key_cache": qkv.key_cache.float().to(torch.float8_e4m3fn),
                               "value_cache": qkv.value_cache.float().to(torch.float8_e4m3fn)},
        "int4 head_dim": {"kv_format": "int4", "query": query[..., :48].contiguous(), "key_cache": int4_data[..., :24],
                          "value_cache": int4_data[..., :24]},
        "int4 width": {"kv_format": "int4", "k_scale": None},
    }
    args.update(changes[case])
    return args


@pytest.mark.parametrize(("case", "message"), [
    ("unknown format", "unknown kv_format 'fp8'; choose one of auto, fp8_e4m3, int8, int4"),
    ("cache dtype", "key_cache has dtype torch.uint8 but kv_format 'int8' stores torch.int8"),
    ("missing scale", r"kv_format 'int8' needs v_scale: \(\d+, 16, 3\) torch.float16"),
    ("scale ndim", "k_scale must have 3 dimensions"),
    ("scale shape", r"k_scale has shape \(\d+, 16, 3\) but kv_format 'int8' with caches"),
    ("scale dtype", "k_scale has dtype torch.float32"),
    ("scales with auto", "k_scale / v_scale were given with kv_format 'auto'"),
    ("fp8 without scales", r"kv_format 'fp8_e4m3' needs k_scale: \(3,\) torch.float32"),
    ("int4 head_dim", "needs head_dim divisible by 32 .* got head_dim 48"),
    ("int4 width", r"key_cache.shape\[3\] is 64 but must equal head_dim // 2"),
])
@pytest.mark.parametrize("launcher", ["triton", "reference"])
def test_launchers_and_references_reject_bad_format_arguments(case, message, launcher):
    fn = paged_decode_attention_triton if launcher == "triton" else paged_decode_attention_reference
    with pytest.raises(ValueError, match=message):
        fn(**_bad(case))
