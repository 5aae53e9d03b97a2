"""Paged decode attention: the Triton kernel (interpreter on CPU, or CUDA) and the fast CPU path against the
reference, and the reference against literal loops. Every cache slot a test did not fill is NaN, unused
block-table entries point at NaN blocks, and outputs start as NaN, so a wrong read or a missed write cannot
pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from kernel_testing import (
    DECODE_CONTEXT_LENS,
    GQA_RATIOS,
    HEAD_DIM_AND_BLOCK_CASES,
    TOLERANCES,
    assert_close,
    attention_by_loops,
    check_large_block_ids_in_subprocess,
    poisoned_like,
    random_paged_kv,
    random_queries,
    upcast,
)

from workbench_kernels.paged_decode_attention import (
    _choose_splits,
    decode_gather_plan,
    paged_decode_attention,
    paged_decode_attention_cpu,
    paged_decode_attention_reference,
    paged_decode_attention_triton,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _case(device, dtype, num_heads, num_kv_heads, head_dim, block_size, context_lens=DECODE_CONTEXT_LENS, seed=0):
    kv = random_paged_kv(context_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
                         dtype=dtype, seed=seed, device=device)
    query = random_queries(len(context_lens), num_heads, head_dim, dtype, seed=seed + 1, device=device)
    return query, kv, head_dim**-0.5


def _expected(query, kv, scale):
    """The reference in float32 on the CPU, from the same (rounded) inputs: the exact answer for this dtype."""
    q, k, v = upcast(query.cpu(), kv.key_cache.cpu(), kv.value_cache.cpu())
    return paged_decode_attention_reference(q, k, v, kv.block_tables.cpu(), kv.context_lens.cpu(), scale)


def _check_kernel(device, dtype, num_heads, num_kv_heads, head_dim=64, block_size=16, query_view=False, **knobs):
    query, kv, scale = _case(device, dtype, num_heads, num_kv_heads, head_dim, block_size)
    if query_view:  # as sliced out of a fused q|k|v projection: rows are not contiguous
        fused = torch.randn((query.shape[0], num_heads + 2 * num_kv_heads, head_dim), device=device).to(dtype)
        fused[:, :num_heads] = query
        query = fused[:, :num_heads]
    out = paged_decode_attention_triton(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens,
                                        scale, out=poisoned_like(query), **knobs)
    assert_close(out, _expected(query, kv, scale), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), GQA_RATIOS)
def test_kernel_matches_reference_for_gqa_ratios(device, dtype, num_heads, num_kv_heads):
    _check_kernel(device, dtype, num_heads, num_kv_heads)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "gqa", "head_dim", "block_size"), HEAD_DIM_AND_BLOCK_CASES)
def test_kernel_matches_reference_for_head_dims_and_block_sizes(device, dtype, gqa, head_dim, block_size):
    _check_kernel(device, dtype, *gqa, head_dim=head_dim, block_size=block_size)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("block_size", "knobs"), [
    (32, {"tile_size": 16}),  # several tiles per sequence, tiles smaller than a block
    (8, {"tile_size": 16, "num_splits": 3}),  # flash-decoding: partial results merged
    (16, {"tile_size": 16, "num_splits": 7}),  # more splits than short sequences have keys: empty splits
])
def test_kernel_tiles_and_splits(device, dtype, block_size, knobs):
    _check_kernel(device, dtype, 9, 3, block_size=block_size, **knobs)


@pytest.mark.parametrize("device", DEVICES)
def test_short_contexts_in_a_wide_table_spread_over_the_splits(device):
    """A CUDA graph's block table spans the model's whole context; each sequence divides its own few tiles among
    the splits (one tile each here), and the splits past its last tile contribute nothing to the merge."""
    query, kv, scale = _case(device, torch.float32, 9, 3, 64, 16)
    wide = torch.cat([kv.block_tables, torch.zeros(kv.block_tables.shape[0], 40, dtype=kv.block_tables.dtype,
                                                   device=kv.block_tables.device)], dim=1)
    out = paged_decode_attention_triton(query, kv.key_cache, kv.value_cache, wide, kv.context_lens, scale,
                                        tile_size=16, num_splits=12, out=poisoned_like(query))
    assert_close(out, _expected(query, kv, scale), torch.float32)


@pytest.mark.parametrize(("programs", "max_tiles", "expected"), [
    (96, 9, 2),  # 32 sequences x 3 KV heads, 512 keys: each split keeps >= 4 tiles
    (3, 512, 32),  # one long sequence: capped at MAX_SPLITS
    (300, 512, 1),  # the SMs are already busy
    (8, 2, 1),  # too few tiles to split
])
def test_automatic_split_count_on_cuda(monkeypatch, programs, max_tiles, expected):
    """The heuristic alone (no GPU needed): the launcher asks for the SM count, 132 on an H100 SXM."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    assert _choose_splits(torch.device("cuda"), programs, max_tiles, None) == expected
    assert _choose_splits(torch.device("cpu"), programs, max_tiles, None) == 1
    assert _choose_splits(torch.device("cuda"), programs, max_tiles, 5) == min(5, max_tiles)


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_accepts_a_query_view(device):
    _check_kernel(device, torch.float32, 8, 2, query_view=True)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(9, 3), (4, 4)])
def test_reference_matches_literal_loops(num_heads, num_kv_heads):
    query, kv, scale = _case("cpu", torch.float32, num_heads, num_kv_heads, 16, 4, context_lens=[1, 6, 13, 9])
    expected = attention_by_loops(query, kv, [1] * 4, scale)
    got = paged_decode_attention_reference(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens,
                                           scale)
    assert_close(got, expected, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("path", [paged_decode_attention_reference, paged_decode_attention_cpu])
def test_reference_and_cpu_path_in_low_precision(dtype, path):
    """The CPU engine may run in bf16/fp16: both CPU functions must stay within that dtype's tolerance."""
    query, kv, scale = _case("cpu", dtype, 9, 3, 64, 16)
    got = path(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens, scale)
    assert got.dtype == dtype
    assert_close(got, _expected(query, kv, scale), dtype)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), GQA_RATIOS)
def test_public_function_on_cpu_runs_the_fast_path_which_matches_the_reference(num_heads, num_kv_heads):
    query, kv, scale = _case("cpu", torch.float32, num_heads, num_kv_heads, 64, 16)
    args = query, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens, scale
    assert torch.equal(paged_decode_attention(*args), paged_decode_attention_cpu(*args))
    assert_close(paged_decode_attention_cpu(*args), paged_decode_attention_reference(*args), torch.float32)


def test_comparison_helper_reports_the_mismatch():
    expected = torch.ones(2, 3)
    actual = expected.clone()
    actual[1, 2] = 1.5
    actual[0, 0] = float("nan")
    with pytest.raises(AssertionError) as failure:
        assert_close(actual, expected)
    message = str(failure.value)
    assert "2 of 6 elements differ" in message and "max abs err 5.000e-01" in message
    assert "at [0, 0]: actual nan, expected 1" in message and "at [1, 2]: actual 1.5, expected 1" in message
    assert TOLERANCES[torch.float32][1] <= 1e-5  # float32 stays tight


def _bad(case: str):
    query, kv, scale = _case("cpu", torch.float32, 9, 3, 64, 16)
    args = {"query": query, "key_cache": kv.key_cache, "value_cache": kv.value_cache,
            "block_tables": kv.block_tables, "context_lens": kv.context_lens, "scale": scale}
    changes = {
        "query 2-D": {"query": query[:, 0]},
        "query dtype": {"query": query.double()},
        "cache dtype": {"key_cache": kv.key_cache.half(), "value_cache": kv.value_cache.half()},
        "head_dim": {"query": query[:, :, :32].contiguous()},
        "gqa": {"query": query[:, :8].contiguous()},
        "table dtype": {"block_tables": kv.block_tables.float()},
        "table rows": {"block_tables": kv.block_tables[:-1]},
        "lens rows": {"context_lens": kv.context_lens[:-1]},
        "lens device": {"context_lens": kv.context_lens.to("meta")},
        "scale": {"scale": 0.0},
        "out shape": {"out": torch.empty(1, 9, 64)},
        "tile": {"tile_size": 24},
        "splits": {"num_splits": 0},
    }
    args.update(changes[case])
    return args


@pytest.mark.parametrize(("case", "message"), [
    ("query 2-D", "query must have 3 dimensions"),
    ("query dtype", "query has dtype torch.float64"),
    ("cache dtype", "with kv_format .auto. the cache must hold the activations. dtype"),
    ("head_dim", r"key_cache.shape\[3\] is 64 but must equal head_dim \(32\)"),
    ("gqa", r"num_heads \(8\) must be a multiple of num_kv_heads \(3\)"),
    ("table dtype", "block_tables has dtype torch.float32"),
    ("table rows", r"block_tables.shape\[0\] is 4"),
    ("lens rows", r"context_lens.shape\[0\] is 4"),
    ("lens device", "context_lens is on meta"),
    ("scale", "scale must be a positive finite float, got 0.0"),
    ("out shape", r"out has shape \(1, 9, 64\), expected \(5, 9, 64\)"),
    ("tile", "tile_size must be a power of two >= 16, got 24"),
    ("splits", "num_splits must be >= 1, got 0"),
])
def test_launcher_rejects_bad_arguments(case, message):
    with pytest.raises(ValueError, match=message):
        paged_decode_attention_triton(**_bad(case))


@pytest.mark.parametrize("device", DEVICES)
def test_block_ids_past_2_31_elements(device):
    """Block ids whose offsets pass 2**31 elements (a ~4.3 GiB float16 cache, lazily backed, top blocks used).

    Run in a subprocess: under the interpreter an int32 offset wraps negative and the load reads outside the
    cache, which crashes the process (SIGSEGV) instead of failing an assert; reverting the int64 cast in
    _paged_tiles._kv_tile_offsets made this test fail that way."""
    check_large_block_ids_in_subprocess("decode", device)


def test_cpu_path_with_a_precomputed_gather_plan():
    """The CPU engine works out where the keys are once per step and hands that plan to every layer; a single
    sequence on consecutive blocks is read in place, without a gather. Same answers either way."""
    torch.manual_seed(0)
    num_blocks, block_size, kv_heads, head_dim = 12, 4, 2, 16
    key_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim)
    value_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim)
    cases = [([[3, 4, 5, 6]], [14]),  # consecutive: no gather
             ([[3, 9, 5, 6]], [14]),  # one block elsewhere
             ([[3, 4, 5, 6]], [4]),  # context ends on a block boundary
             ([[7, 2, 0, 1], [4, 5, 6, 11]], [9, 16])]  # two sequences, ragged
    for tables, lens in cases:
        tables = torch.tensor(tables, dtype=torch.int32)
        lens = torch.tensor(lens, dtype=torch.int32)
        query = torch.randn(len(lens), 4, head_dim)
        kv = SimpleNamespace(key_cache=key_cache, value_cache=value_cache, block_tables=tables, context_lens=lens)
        expected = attention_by_loops(query, kv, [1] * len(lens), 0.25).float()
        plan = decode_gather_plan(tables, lens, block_size)
        assert (plan.ids is None) == (tables.tolist() == [[3, 4, 5, 6]])
        for kwargs in ({}, {"cpu_plan": plan}):
            out = paged_decode_attention(query, key_cache, value_cache, tables, lens, 0.25, **kwargs)
            assert_close(out, expected, torch.float32)
