"""Sliding-window paged attention: decode and prefill, the Triton kernels (interpreter on CPU, or CUDA), the fast
CPU paths and the references, against literal loops that let query ``p`` see keys ``p - window + 1 .. p`` only.

The block-table entries wholly before each sequence's window are pointed at NaN blocks ("holes", as the hybrid
block manager leaves them after freeing), so any read outside the window turns the output into NaN."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import (
    GQA_RATIOS,
    MIXED_STEP_CONTEXT_LENS,
    MIXED_STEP_QUERY_LENS,
    TOLERANCES,
    PagedKV,
    assert_close,
    attention_by_loops,
    poisoned_like,
    query_start_loc,
    random_paged_kv,
    random_queries,
    upcast,
)

from workbench_kernels.paged_decode_attention import (
    decode_gather_plan,
    paged_decode_attention_cpu,
    paged_decode_attention_reference,
    paged_decode_attention_triton,
)
from workbench_kernels.paged_prefill_attention import (
    paged_prefill_attention_cpu,
    paged_prefill_attention_reference,
    paged_prefill_attention_triton,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
WINDOWS = [1, 5, 16, 33, 1000]  # one key; inside a block; a block; straddling blocks; wider than any context


def _holes(kv: PagedKV, query_lens: list[int], window: int) -> PagedKV:
    """Point every table entry wholly before a sequence's first visible key at a NaN block."""
    table = kv.block_tables.clone()
    block_size = kv.key_cache.shape[1]
    nan_block = int(kv.block_tables[0, -1])  # random_paged_kv's spare columns name NaN blocks
    for seq, q_len in enumerate(query_lens):
        first = max(0, int(kv.context_lens[seq]) - q_len - window + 1)
        table[seq, : first // block_size] = nan_block
    return PagedKV(kv.key_cache, kv.value_cache, table, kv.context_lens)


def _prefill_case(device, dtype, heads, kv_heads, block_size=16, seed=0):
    kv = random_paged_kv(MIXED_STEP_CONTEXT_LENS, num_kv_heads=kv_heads, head_dim=64, block_size=block_size,
                         dtype=dtype, seed=seed, device=device)
    query = random_queries(sum(MIXED_STEP_QUERY_LENS), heads, 64, dtype, seed=seed + 1, device=device)
    return query, kv, query_start_loc(MIXED_STEP_QUERY_LENS, device)


@pytest.mark.parametrize("window", WINDOWS)
def test_references_match_literal_loops(window):
    query, kv, starts = _prefill_case("cpu", torch.float32, 9, 3)
    expected = attention_by_loops(query, kv, MIXED_STEP_QUERY_LENS, 0.125, window)
    holed = _holes(kv, MIXED_STEP_QUERY_LENS, window)
    out = paged_prefill_attention_reference(query, holed.key_cache, holed.value_cache, holed.block_tables, starts,
                                            holed.context_lens, 0.125, window=window)
    assert_close(out, expected.float(), torch.float32, what="prefill reference")
    decode_lens = [1] * len(MIXED_STEP_CONTEXT_LENS)
    holed = _holes(kv, decode_lens, window)
    q = query[: len(decode_lens)]
    out = paged_decode_attention_reference(q, holed.key_cache, holed.value_cache, holed.block_tables,
                                           holed.context_lens, 0.125, window=window)
    assert_close(out, attention_by_loops(q, kv, decode_lens, 0.125, window).float(), torch.float32,
                 what="decode reference")


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), GQA_RATIOS)
def test_cpu_paths_match_the_references(window, num_heads, num_kv_heads):
    query, kv, starts = _prefill_case("cpu", torch.float32, num_heads, num_kv_heads)
    holed = _holes(kv, MIXED_STEP_QUERY_LENS, window)
    args = (holed.key_cache, holed.value_cache, holed.block_tables, starts, holed.context_lens, 0.125)
    assert_close(paged_prefill_attention_cpu(query, *args, window=window),
                 paged_prefill_attention_reference(query, *args, window=window), what="prefill cpu")
    decode_lens = [1] * len(MIXED_STEP_CONTEXT_LENS)
    holed = _holes(kv, decode_lens, window)
    q = query[: len(decode_lens)]
    args = (holed.key_cache, holed.value_cache, holed.block_tables, holed.context_lens, 0.125)
    expected = paged_decode_attention_reference(q, *args, window=window)
    assert_close(paged_decode_attention_cpu(q, *args, window=window), expected, what="decode cpu")
    plan = decode_gather_plan(holed.block_tables, holed.context_lens, 16, window)  # one plan for every layer
    assert_close(paged_decode_attention_cpu(q, *args, window=window, plan=plan), expected, what="decode cpu plan")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [5, 33])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(9, 3), (8, 2)])
def test_triton_kernels_match_the_references(device, dtype, window, num_heads, num_kv_heads):
    query, kv, starts = _prefill_case(device, dtype, num_heads, num_kv_heads, block_size=8)
    holed = _holes(kv, MIXED_STEP_QUERY_LENS, window)
    out = paged_prefill_attention_triton(query, holed.key_cache, holed.value_cache, holed.block_tables, starts,
                                         holed.context_lens, 0.125, window=window, out=poisoned_like(query))
    q, k, v = upcast(query.cpu(), kv.key_cache.cpu(), kv.value_cache.cpu())
    expected = paged_prefill_attention_reference(q, k, v, holed.block_tables.cpu(), starts.cpu(),
                                                 kv.context_lens.cpu(), 0.125, window=window)
    assert_close(out, expected, dtype, what="prefill kernel")
    decode_lens = [1] * len(MIXED_STEP_CONTEXT_LENS)
    holed = _holes(kv, decode_lens, window)
    qd = query[: len(decode_lens)].contiguous()
    expected = paged_decode_attention_reference(q[: len(decode_lens)], k, v, holed.block_tables.cpu(),
                                                kv.context_lens.cpu(), 0.125, window=window)
    for splits in (1, 3):  # flash-decoding splits start at the window's first tile
        out = paged_decode_attention_triton(qd, holed.key_cache, holed.value_cache, holed.block_tables,
                                            holed.context_lens, 0.125, window=window, num_splits=splits,
                                            tile_size=16, out=poisoned_like(qd))
        assert_close(out, expected, dtype, what=f"decode kernel, {splits} splits")


def test_window_wider_than_the_context_is_plain_causal_attention():
    query, kv, starts = _prefill_case("cpu", torch.float32, 8, 2)
    args = (kv.key_cache, kv.value_cache, kv.block_tables, starts, kv.context_lens, 0.125)
    atol, rtol = TOLERANCES[torch.float32]
    torch.testing.assert_close(paged_prefill_attention_cpu(query, *args, window=10_000),
                               paged_prefill_attention_cpu(query, *args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("window", [0, -3, 2.5, True])
def test_bad_windows_are_refused(window):
    query, kv, starts = _prefill_case("cpu", torch.float32, 8, 2)
    with pytest.raises(ValueError, match="window must be None or an integer"):
        paged_prefill_attention_cpu(query, kv.key_cache, kv.value_cache, kv.block_tables, starts, kv.context_lens,
                                    0.125, window=window)
