"""Test helpers for the kernels: random paged-cache inputs that expose wrong reads, and an error-reporting compare.

Why it exists: the kernel tests (and the GPU benchmark) need the same inputs: random values (never zeros, which
hide wrong reads), shuffled block tables whose unused entries point at garbage, and every cache slot the test
did not write poisoned with NaN, so that reading a wrong slot turns the output into NaN. They live with the tests,
not in the installed kernel package; the decode benchmark puts this folder on its path to reuse them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.intmath import ceil_div

# Cases the kernel test files share, so the decode, prefill and quantized-cache tests exercise the same shapes.
GQA_RATIOS = [(9, 3), (8, 2), (5, 1), (1, 1)]  # (num_heads, num_kv_heads): groups of 3, 4, 5 and 1
DECODE_CONTEXT_LENS = [1, 17, 40, 100, 33]  # 1, and lengths that are not multiples of the block sizes
# A mixed step: decode rows (query length 1, context 1 included), whole prompts (query length == context) and
# chunks after a cached prefix.
MIXED_STEP_QUERY_LENS = [1, 7, 1, 20, 30, 5, 1]
MIXED_STEP_CONTEXT_LENS = [1, 30, 17, 20, 45, 5, 64]
# (dtype, (num_heads, num_kv_heads), head_dim, block_size) beyond the default 64 / 16.
HEAD_DIM_AND_BLOCK_CASES = [
    (torch.float32, (8, 2), 128, 8),
    (torch.bfloat16, (9, 3), 128, 32),
    (torch.float16, (5, 1), 128, 16),
    (torch.float32, (9, 3), 80, 8),  # head_dim that is not a power of two: padded and masked
]

# One tolerance per dtype (atol, rtol), for kernel outputs against the float32 reference on the same inputs.
# float32: the kernels use IEEE fp32 dots, only the summation order differs. float16/bfloat16: the kernels round
# the softmax probabilities to the activation dtype before the P@V dot (as flash attention does) and round the
# output once; bfloat16 keeps 8 mantissa bits (2**-8 = 0.4% relative).
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 5e-3),
    torch.bfloat16: (1.6e-2, 2e-2),
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None,
                 *, what: str = "output", show: int = 5) -> None:
    """Fail unless ``|actual - expected| <= atol + rtol * |expected|`` everywhere (NaN never matches).

    The tolerance is ``TOLERANCES[dtype]`` (default: ``actual``'s dtype). On failure the message gives the max and
    mean absolute error and the first ``show`` mismatching indices with both values."""
    dtype = dtype or actual.dtype
    atol, rtol = TOLERANCES[dtype]
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    err = (a - e).abs()
    bad = ~(err <= atol + rtol * e.abs())  # written so that NaN in either counts as a mismatch
    if not bool(bad.any()):
        return
    finite = err[torch.isfinite(err)]
    lines = [f"{what}: {int(bad.sum())} of {bad.numel()} elements differ beyond atol={atol}, rtol={rtol} "
             f"({dtype}); max abs err {finite.max().item() if finite.numel() else float('nan'):.3e}, "
             f"mean abs err {finite.mean().item() if finite.numel() else float('nan'):.3e}, "
             f"NaN in actual: {int(a.isnan().sum())}, in expected: {int(e.isnan().sum())}"]
    for index in bad.nonzero()[:show].tolist():
        i = tuple(index)
        lines.append(f"  at {list(i)}: actual {a[i].item():.6g}, expected {e[i].item():.6g}")
    raise AssertionError("\n".join(lines))


@dataclass
class PagedKV:
    """A paged cache holding random keys/values for some sequences; every other slot of the pool is NaN."""

    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32; unused entries point at NaN blocks
    context_lens: torch.Tensor  # [num_seqs] int32


def random_paged_kv(context_lens: list[int], *, num_kv_heads: int, head_dim: int, block_size: int,
                    dtype: torch.dtype, seed: int, num_blocks: int | None = None, first_block: int = 0,
                    spare_blocks: int = 4, device: str | torch.device = "cpu") -> PagedKV:
    """Random K/V for sequences of ``context_lens`` keys, in shuffled blocks drawn from ``first_block..num_blocks``.

    Only the blocks from ``first_block`` up are touched (poisoned with NaN, then partly written): with a large
    ``num_blocks`` and ``first_block`` near the top, the untouched rest of a huge ``torch.empty`` cache costs no
    memory, which lets a test reach block ids whose offsets pass 2**31 elements."""
    gen = torch.Generator().manual_seed(seed)
    needed = [ceil_div(n, block_size) for n in context_lens]
    pool = sum(needed) + spare_blocks
    num_blocks = num_blocks if num_blocks is not None else first_block + pool
    if num_blocks - first_block < pool:
        raise ValueError(f"blocks {first_block}..{num_blocks} hold fewer than the {pool} blocks needed")
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.empty(shape, dtype=dtype, device=device)
    value_cache = torch.empty(shape, dtype=dtype, device=device)
    key_cache[first_block:] = float("nan")
    value_cache[first_block:] = float("nan")
    ids = (first_block + torch.randperm(num_blocks - first_block, generator=gen)[:pool]).tolist()
    spare = ids[sum(needed):]
    width = max(needed) + 2  # extra columns: garbage that the kernels must never follow
    table = torch.tensor(spare, dtype=torch.int32)[torch.randint(len(spare), (len(needed), width), generator=gen)]
    cursor = 0
    for seq, (n, count) in enumerate(zip(context_lens, needed, strict=True)):
        blocks = ids[cursor:cursor + count]
        cursor += count
        table[seq, :count] = torch.tensor(blocks, dtype=torch.int32)
        positions = torch.arange(n)
        block_of = torch.tensor(blocks)[positions // block_size].to(device)
        offset_of = (positions % block_size).to(device)
        for cache in (key_cache, value_cache):
            values = torch.randn((n, num_kv_heads, head_dim), generator=gen).to(dtype)
            cache[block_of, offset_of] = values.to(device)
    return PagedKV(key_cache, value_cache, table.to(device),
                   torch.tensor(context_lens, dtype=torch.int32, device=device))


def compact_paged_kv(kv: PagedKV) -> PagedKV:
    """The same sequences in a cache holding only the blocks the table names, renumbered from 0.

    For references on huge, mostly untouched caches: upcasting or copying the full cache would allocate it all."""
    ids = kv.block_tables.unique()
    table = torch.searchsorted(ids, kv.block_tables.contiguous()).to(kv.block_tables.dtype)
    return PagedKV(kv.key_cache[ids], kv.value_cache[ids], table, kv.context_lens)


def random_queries(num_tokens: int, num_heads: int, head_dim: int, dtype: torch.dtype, seed: int,
                   device: str | torch.device = "cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((num_tokens, num_heads, head_dim), generator=gen).to(dtype).to(device)


def query_start_loc(query_lens: list[int], device: str | torch.device = "cpu") -> torch.Tensor:
    """Cumulative query lengths ``[num_seqs + 1]`` int32, starting at 0."""
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    return torch.tensor(starts, dtype=torch.int32, device=device)


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """A NaN-filled tensor shaped like ``t``: an output a kernel forgot to write stays NaN."""
    return torch.full_like(t, float("nan"))


def upcast(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Float tensors in float32 (index tensors unchanged): the reference then computes the exact answer."""
    return [t.float() if t.is_floating_point() else t for t in tensors]


def attention_by_loops(query: torch.Tensor, kv: PagedKV, query_lens: list[int], scale: float,
                       window: int | None = None) -> torch.Tensor:
    """Paged attention written as literal loops in float64, to check the references themselves (tiny shapes only).

    Query ``i`` of a sequence with ``q`` new tokens and ``n`` keys sits at position ``p = n - q + i`` and sees keys
    ``0..p`` (with a sliding ``window``, ``p - window + 1..p``); with every ``q = 1`` this is decode attention."""
    num_heads = query.shape[1]
    block_size, num_kv_heads = kv.key_cache.shape[1], kv.key_cache.shape[2]
    out, row = torch.empty(query.shape, dtype=torch.float64), 0
    for seq, q_len in enumerate(query_lens):
        n = int(kv.context_lens[seq])
        slots = [(int(kv.block_tables[seq, t // block_size]), t % block_size) for t in range(n)]
        keys = torch.stack([kv.key_cache[b, o] for b, o in slots]).double()
        values = torch.stack([kv.value_cache[b, o] for b, o in slots]).double()
        for i in range(q_len):
            p = n - q_len + i
            lo = 0 if window is None else max(0, p - window + 1)
            for h in range(num_heads):
                kv_head = h // (num_heads // num_kv_heads)
                weights = torch.softmax(keys[lo:p + 1, kv_head] @ query[row, h].double() * scale, dim=0)
                out[row, h] = weights @ values[lo:p + 1, kv_head]
            row += 1
    return out


def check_large_block_ids(kernel: str, device: str = "cpu") -> None:
    """Run ``kernel`` ("store_kv", "decode" or "prefill") on blocks whose element offsets pass 2**31; raise if wrong.

    The float16 cache is ~4.3 GiB per tensor but only its top 48 blocks are touched (``torch.empty`` is lazily
    backed). Under the interpreter, offsets computed in int32 wrap negative and read outside the cache, which
    crashes the process (SIGSEGV, checked by reverting the int64 casts), hence tests run this in a subprocess."""
    from workbench_kernels import paged_decode_attention as decode
    from workbench_kernels import paged_prefill_attention as prefill
    from workbench_kernels import store_kv

    if kernel not in ("store_kv", "decode", "prefill"):
        raise ValueError(f"unknown kernel {kernel!r}: choose 'store_kv', 'decode' or 'prefill'")
    num_heads, num_kv_heads, head_dim, block_size = 8, 8, 128, 16
    num_blocks = 2**31 // (block_size * num_kv_heads * head_dim) + 48
    context_lens = [37, 70, 5]
    kv = random_paged_kv(context_lens, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
                         dtype=torch.float16, seed=7, num_blocks=num_blocks, first_block=num_blocks - 48,
                         device=device)
    if int(kv.block_tables[:, 0].min()) * kv.key_cache.stride(0) < 2**31:
        raise AssertionError("the test's block ids do not reach 2**31 elements")
    if kernel == "store_kv":
        _check_store_at_large_slots(store_kv.store_kv_triton, kv, seed=8)
        return
    small = compact_paged_kv(kv)
    query_lens = [1, 1, 1] if kernel == "decode" else [10, 70, 1]
    query = random_queries(sum(query_lens), num_heads, head_dim, torch.float16, seed=9, device=device)
    if kernel == "decode":
        out = decode.paged_decode_attention_triton(query, kv.key_cache, kv.value_cache, kv.block_tables,
                                                   kv.context_lens, 0.1)
        expected = decode.paged_decode_attention_reference(*upcast(query, small.key_cache, small.value_cache),
                                                           small.block_tables, small.context_lens, 0.1)
    else:
        starts = query_start_loc(query_lens, device)
        out = prefill.paged_prefill_attention_triton(query, kv.key_cache, kv.value_cache, kv.block_tables, starts,
                                                     kv.context_lens, 0.1)
        expected = prefill.paged_prefill_attention_reference(*upcast(query, small.key_cache, small.value_cache),
                                                             small.block_tables, starts, small.context_lens, 0.1)
    assert_close(out, expected, what=f"{kernel} at block ids past 2**31 elements")


def check_large_block_ids_in_subprocess(kernel: str, device: str = "cpu") -> None:
    """`check_large_block_ids` in a fresh interpreter (under TRITON_INTERPRET on the CPU); raise AssertionError
    with its exit code and stderr if it fails: an out-of-bounds access there kills the process (exit -11)
    rather than failing an assert, and must not take the test session down with it."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from kernel_testing import "
            f"check_large_block_ids; check_large_block_ids({kernel!r}, {device!r})")
    env = {**os.environ, **({"TRITON_INTERPRET": "1"} if device == "cpu" else {})}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    if result.returncode != 0:
        raise AssertionError(f"{kernel} at large block ids: exit code {result.returncode} (-11: out-of-bounds "
                             f"access)\n{result.stderr[-3000:]}")


def _check_store_at_large_slots(store, kv: PagedKV, seed: int) -> None:
    block_size, num_kv_heads, head_dim = kv.key_cache.shape[1:]
    gen = torch.Generator().manual_seed(seed)
    slots = kv.block_tables[:, 0].long() * block_size + torch.randint(block_size, (3,), generator=gen).to(
        kv.block_tables.device)
    key = torch.randn((3, num_kv_heads, head_dim), generator=gen).to(kv.key_cache)
    value = torch.randn((3, num_kv_heads, head_dim), generator=gen).to(kv.key_cache)
    store(key, value, kv.key_cache, kv.value_cache, slots.to(torch.int32))  # int32 slots: no free widening
    blocks, offsets = slots // block_size, slots % block_size
    if not (torch.equal(kv.key_cache[blocks, offsets], key) and torch.equal(kv.value_cache[blocks, offsets], value)):
        raise AssertionError("store_kv wrote the wrong slots at block ids past 2**31 elements")
