"""Paged prefill attention: the Triton kernel (interpreter on CPU, or CUDA) against the reference on mixed batches
of single-token rows and chunks with and without a cached prefix, and the reference against literal loops. Unfilled
cache slots, unused block-table targets and outputs all start as NaN."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import (
    GQA_RATIOS,
    HEAD_DIM_AND_BLOCK_CASES,
    MIXED_STEP_CONTEXT_LENS,
    MIXED_STEP_QUERY_LENS,
    assert_close,
    attention_by_loops,
    check_large_block_ids_in_subprocess,
    poisoned_like,
    query_start_loc,
    random_paged_kv,
    random_queries,
    upcast,
)

from workbench_kernels.paged_prefill_attention import (
    paged_prefill_attention,
    paged_prefill_attention_cpu,
    paged_prefill_attention_reference,
    paged_prefill_attention_triton,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _case(device, dtype, num_heads, num_kv_heads, head_dim, block_size, query_lens=MIXED_STEP_QUERY_LENS,
          context_lens=MIXED_STEP_CONTEXT_LENS, seed=0):
    kv = random_paged_kv(context_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
                         dtype=dtype, seed=seed, device=device)
    query = random_queries(sum(query_lens), num_heads, head_dim, dtype, seed=seed + 1, device=device)
    return query, kv, query_start_loc(query_lens, device), head_dim**-0.5


def _expected(query, kv, starts, scale):
    """The reference in float32 on the CPU, from the same (rounded) inputs: the exact answer for this dtype."""
    q, k, v = upcast(query.cpu(), kv.key_cache.cpu(), kv.value_cache.cpu())
    return paged_prefill_attention_reference(q, k, v, kv.block_tables.cpu(), starts.cpu(), kv.context_lens.cpu(),
                                             scale)


def _check_kernel(device, dtype, num_heads, num_kv_heads, head_dim=64, block_size=16, query_lens=MIXED_STEP_QUERY_LENS,
                  context_lens=MIXED_STEP_CONTEXT_LENS, **knobs):
    query, kv, starts, scale = _case(device, dtype, num_heads, num_kv_heads, head_dim, block_size, query_lens,
                                     context_lens)
    out = paged_prefill_attention_triton(query, kv.key_cache, kv.value_cache, kv.block_tables, starts,
                                         kv.context_lens, scale, out=poisoned_like(query), **knobs)
    assert_close(out, _expected(query, kv, starts, scale), dtype)


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
@pytest.mark.parametrize(("gqa", "knobs"), [
    ((9, 3), {"block_m": 16, "tile_size": 16}),  # 5 query tokens per program: many blocks, gaps in the numbering
    ((5, 1), {"block_m": 16, "tile_size": 16}),  # 3 query tokens per program
    ((8, 2), {"block_m": 32, "tile_size": 32}),
])
def test_kernel_with_small_tiles(device, dtype, gqa, knobs):
    _check_kernel(device, dtype, *gqa, block_size=8, **knobs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("query_lens", "context_lens"), [
    ([37], [37]),  # one sequence, a whole prompt
    ([1], [1]),  # one sequence, one token
    ([150, 1, 200], [400, 300, 230]),  # verifying many tokens after a long prefix
])
def test_kernel_single_sequences_and_long_chunks(device, query_lens, context_lens):
    _check_kernel(device, torch.float32, 8, 2, query_lens=query_lens, context_lens=context_lens)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(9, 3), (4, 4)])
def test_reference_matches_literal_loops(num_heads, num_kv_heads):
    query_lens, context_lens = [1, 4, 6, 1, 3], [1, 9, 6, 7, 3]
    query, kv, starts, scale = _case("cpu", torch.float32, num_heads, num_kv_heads, 16, 4, query_lens, context_lens)
    expected = attention_by_loops(query, kv, query_lens, scale)
    got = paged_prefill_attention_reference(query, kv.key_cache, kv.value_cache, kv.block_tables, starts,
                                            kv.context_lens, scale)
    assert_close(got, expected, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("path", [paged_prefill_attention_reference, paged_prefill_attention_cpu])
def test_reference_and_cpu_path_in_low_precision(dtype, path):
    """The CPU engine may run in bf16/fp16: both CPU functions must stay within that dtype's tolerance."""
    query, kv, starts, scale = _case("cpu", dtype, 9, 3, 64, 16)
    got = path(query, kv.key_cache, kv.value_cache, kv.block_tables, starts, kv.context_lens, scale)
    assert got.dtype == dtype
    assert_close(got, _expected(query, kv, starts, scale), dtype)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), GQA_RATIOS)
def test_public_function_on_cpu_runs_the_fast_path_which_matches_the_reference(num_heads, num_kv_heads):
    query, kv, starts, scale = _case("cpu", torch.float32, num_heads, num_kv_heads, 64, 16)
    args = query, kv.key_cache, kv.value_cache, kv.block_tables, starts, kv.context_lens, scale
    assert torch.equal(paged_prefill_attention(*args), paged_prefill_attention_cpu(*args))
    assert_close(paged_prefill_attention_cpu(*args), paged_prefill_attention_reference(*args), torch.float32)


def _bad(case: str):
    query, kv, starts, scale = _case("cpu", torch.float32, 9, 3, 64, 16)
    args = {"query": query, "key_cache": kv.key_cache, "value_cache": kv.value_cache,
            "block_tables": kv.block_tables, "query_start_loc": starts, "context_lens": kv.context_lens,
            "scale": scale}
    changes = {
        "query 4-D": {"query": query[None]},
        "cache dtype": {"key_cache": kv.key_cache.bfloat16(), "value_cache": kv.value_cache.bfloat16()},
        "gqa": {"query": query[:, :8].contiguous()},
        "starts length": {"query_start_loc": starts[:-1]},
        "starts dtype": {"query_start_loc": starts.float()},
        "table rows": {"block_tables": kv.block_tables[:-1]},
        "table device": {"block_tables": kv.block_tables.to("meta")},
        "scale": {"scale": float("inf")},
        "block_m": {"block_m": 8},
        "out dtype": {"out": torch.empty_like(query, dtype=torch.float16)},
    }
    args.update(changes[case])
    return args


@pytest.mark.parametrize(("case", "message"), [
    ("query 4-D", "query must have 3 dimensions"),
    ("cache dtype", "with kv_format .auto. the cache must hold the activations. dtype"),
    ("gqa", r"num_heads \(8\) must be a multiple of num_kv_heads \(3\)"),
    ("starts length", r"query_start_loc.shape\[0\] is 7 but must equal len\(context_lens\) \+ 1 \(8\)"),
    ("starts dtype", "query_start_loc has dtype torch.float32"),
    ("table rows", r"block_tables.shape\[0\] is 6"),
    ("table device", "block_tables is on meta"),
    ("scale", "scale must be a positive finite float, got inf"),
    ("block_m", "block_m must be a power of two >= 16, got 8"),
    ("out dtype", "out has dtype torch.float16"),
])
def test_launcher_rejects_bad_arguments(case, message):
    with pytest.raises(ValueError, match=message):
        paged_prefill_attention_triton(**_bad(case))


@pytest.mark.parametrize("device", DEVICES)
def test_block_ids_past_2_31_elements(device):
    """Block ids whose offsets pass 2**31 elements (a ~4.3 GiB float16 cache, lazily backed, top blocks used).

    Run in a subprocess: under the interpreter an int32 offset wraps negative and the load reads outside the
    cache, which crashes the process (SIGSEGV) instead of failing an assert; reverting the int64 cast in
    _paged_tiles._kv_tile_offsets made this test fail that way."""
    check_large_block_ids_in_subprocess("prefill", device)


# ------------------------------------------------------------------------------------------- tree attention
def _ancestors(parents: list[int]) -> torch.Tensor:
    """[T, T] bool: node i sees node j iff j is i or one of its ancestors."""
    seen = torch.eye(len(parents), dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            seen[i] |= seen[parent]
    return seen


# (query length, tree size T, context length) per sequence: T = 0 is an ordinary chunk; query length < T is a
# draft expanding the newest nodes of a tree whose older nodes are already cached (one row: it must still go
# through the mask, not the decode path).
TREE_BATCH = [(1, 0, 9), (9, 9, 30), (7, 0, 7), (13, 13, 13), (1, 6, 40), (3, 11, 25), (5, 0, 21)]


def _tree_case(device, dtype, num_heads, num_kv_heads, block_size=8, seed=3):
    gen = torch.Generator().manual_seed(seed)
    query_lens = [q for q, _, _ in TREE_BATCH]
    query, kv, starts, scale = _case(device, dtype, num_heads, num_kv_heads, 32, block_size, query_lens,
                                     [n for _, _, n in TREE_BATCH], seed=seed)
    width = max(t for _, t, _ in TREE_BATCH)
    mask = torch.ones(sum(query_lens), width, dtype=torch.bool)
    row = 0
    for q_len, size, _ in TREE_BATCH:
        if size:
            parents = [-1] + [int(torch.randint(0, i, (), generator=gen)) for i in range(1, size)]
            mask[row: row + q_len, width - size:] = _ancestors(parents)[size - q_len:]
        row += q_len
    return query, kv, starts, scale, mask.to(device)


def _hides_a_causal_key(mask, starts, context_lens) -> list[bool]:
    """Per query row: does the mask hide a key that causal attention would show it?"""
    width, hides = mask.shape[1], []
    for b, (start, end) in enumerate(zip(starts.tolist(), starts.tolist()[1:], strict=False)):
        n, q_len = int(context_lens[b]), end - start
        for i in range(q_len):
            own = width - q_len + i  # the column of the row's own key
            hides.append(bool((~mask[start + i, max(width - n, 0): own + 1]).any()))
    return hides


def _dense_tree_attention(query, kv, starts, scale, mask) -> torch.Tensor:
    """float64 attention per sequence on keys gathered densely, under the causal mask & the tree mask."""
    out = torch.empty(query.shape, dtype=torch.float64)
    block_size, width = kv.key_cache.shape[1], mask.shape[1]
    group = query.shape[1] // kv.key_cache.shape[2]
    for b, (start, end) in enumerate(zip(starts.tolist(), starts.tolist()[1:], strict=False)):
        n, q_len = int(kv.context_lens[b]), end - start
        slots = [(int(kv.block_tables[b, t // block_size]), t % block_size) for t in range(n)]
        keys = torch.stack([kv.key_cache[s, o] for s, o in slots]).double().repeat_interleave(group, 1)
        values = torch.stack([kv.value_cache[s, o] for s, o in slots]).double().repeat_interleave(group, 1)
        visible = torch.arange(n) <= torch.arange(n - q_len, n)[:, None]
        restricted = torch.ones(q_len, n, dtype=torch.bool)
        restricted[:, max(n - width, 0):] = mask[start:end, max(width - n, 0):].cpu()
        scores = torch.einsum("qhd,khd->hqk", query[start:end].double().cpu(), keys.cpu()) * scale
        scores = scores.masked_fill(~(visible & restricted), float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values.cpu())
    return out


@pytest.mark.parametrize("path", [paged_prefill_attention_reference, paged_prefill_attention_cpu])
def test_tree_mask_reference_and_cpu_path_match_dense_masked_attention(path):
    query, kv, starts, scale, mask = _tree_case("cpu", torch.float32, 9, 3)
    args = query, kv.key_cache, kv.value_cache, kv.block_tables, starts, kv.context_lens, scale
    got = path(*args, tree_mask=mask)
    assert_close(got, _dense_tree_attention(query, kv, starts, scale, mask), torch.float32)
    # The mask must matter: causal attention alone differs on the tree rows (and only there).
    causal = path(*args)
    differs = ((got - causal).abs().amax((1, 2)) > 1e-4).tolist()
    assert differs == _hides_a_causal_key(mask, starts, kv.context_lens) and any(differs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "gqa", "knobs"), [
    (torch.float32, (9, 3), {"block_m": 16, "tile_size": 16}),  # a tree spans several programs and key tiles
    (torch.bfloat16, (8, 2), {}),
    (torch.float32, (5, 1), {"block_m": 32, "tile_size": 16}),
    (torch.float16, (4, 4), {"block_m": 16, "tile_size": 32}),
])
def test_tree_mask_kernel_matches_dense_masked_attention(device, dtype, gqa, knobs):
    query, kv, starts, scale, mask = _tree_case(device, dtype, *gqa)
    out = paged_prefill_attention_triton(query, kv.key_cache, kv.value_cache, kv.block_tables, starts,
                                         kv.context_lens, scale, tree_mask=mask, out=poisoned_like(query), **knobs)
    q, k, v = upcast(query.cpu(), kv.key_cache.cpu(), kv.value_cache.cpu())
    expected = _dense_tree_attention(q, type(kv)(k, v, kv.block_tables.cpu(), kv.context_lens.cpu()), starts.cpu(),
                                     scale, mask)
    assert_close(out, expected, dtype)


@pytest.mark.parametrize(("change", "message"), [
    ({"dtype": torch.uint8}, "tree_mask has dtype torch.uint8"),
    ({"rows": -1}, r"tree_mask must be \[total_query_tokens, W\]"),
    ({"transpose": True}, "tree_mask must have stride 1"),
])
def test_bad_tree_masks_are_refused(change, message):
    query, kv, starts, scale, mask = _tree_case("cpu", torch.float32, 9, 3)
    if "dtype" in change:
        mask = mask.to(change["dtype"])
    if "rows" in change:
        mask = mask[:change["rows"]]
    if "transpose" in change:
        mask = torch.ones(mask.shape[1], mask.shape[0], dtype=torch.bool).t()
    for path in (paged_prefill_attention_triton, paged_prefill_attention_reference, paged_prefill_attention_cpu):
        with pytest.raises(ValueError, match=message):
            path(query, kv.key_cache, kv.value_cache, kv.block_tables, starts, kv.context_lens, scale, tree_mask=mask)


@pytest.mark.parametrize(("q_len", "context_len"), [(1132, 1148), (96, 128), (200, 250), (49, 64), (40, 64)])
def test_a_chunk_after_a_short_prefix_runs_causal_and_keeps_the_masked_paths_bits(q_len, context_len):
    """The CPU path runs a chunk over at least PAD_TO_CAUSAL of its keys as the tail of a causal square (fewer
    queries: the explicit mask); either way every row equals explicit-mask SDPA over the chunk, bit for bit."""
    import torch.nn.functional as F

    from workbench_kernels.paged_prefill_attention import PAD_TO_CAUSAL, _chunk_attention

    gen = torch.Generator().manual_seed(q_len)
    query = torch.randn(q_len, 9, 64, generator=gen)
    keys, values = (torch.randn(1, 3, context_len, 64, generator=gen) for _ in range(2))
    mask = torch.ones(q_len, context_len, dtype=torch.bool).tril(diagonal=context_len - q_len)
    masked = F.scaled_dot_product_attention(query.transpose(0, 1)[None], keys, values, attn_mask=mask, scale=0.125,
                                            enable_gqa=True)[0].transpose(0, 1)
    got = _chunk_attention(query, keys, values, 0.125)
    assert torch.equal(got, masked), (q_len >= PAD_TO_CAUSAL * context_len, (got - masked).abs().max())
