"""Paged decode attention: Triton kernel (one split, flash-decoding splits) vs the PyTorch reference, side by side.

Why it exists: decode attention is bound by reading the KV cache, so the table reports the bandwidth each version
reaches (K and V bytes read / time) next to its time, for a sweep of context lengths, and checks every Triton
result against the float32 reference before timing it. Without CUDA it says so and times only the reference,
which is what the CPU engine runs.

    .venv/bin/python benchmarks/bench_decode_kernel.py [--seqs 32] [--contexts 128,512,2048]
        [--heads 9] [--kv-heads 3] [--head-dim 64] [--block-size 16] [--dtype bfloat16] [--tile 64]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from workbench_kernels.paged_decode_attention import (
    paged_decode_attention_reference,
    paged_decode_attention_triton,
)
from workbench_kernels.testing import assert_close, random_paged_kv, random_queries, upcast

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _time_ms(fn, device: torch.device, repeats: int) -> float:
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100)
    fn()  # warm-up: first calls allocate
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def _implementations(device: torch.device, tile: int) -> dict:
    impls = {"reference (SDPA)": paged_decode_attention_reference}
    if device.type == "cuda":
        impls["triton, 1 split"] = lambda *a: paged_decode_attention_triton(*a, tile_size=tile, num_splits=1)
        impls["triton, auto splits"] = lambda *a: paged_decode_attention_triton(*a, tile_size=tile)
    return impls


def _run_context(args, context: int, device: torch.device) -> list[dict]:
    dtype = DTYPES[args.dtype] if device.type == "cuda" else torch.float32
    kv = random_paged_kv([context] * args.seqs, num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                         block_size=args.block_size, dtype=dtype, seed=0, device=device)
    query = random_queries(args.seqs, args.heads, args.head_dim, dtype, seed=1, device=device)
    inputs = (query, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens, args.head_dim**-0.5)
    expected = paged_decode_attention_reference(*upcast(*inputs[:3]), *inputs[3:])
    kv_bytes = 2 * args.seqs * context * args.kv_heads * args.head_dim * kv.key_cache.element_size()
    rows = []
    for name, fn in _implementations(device, args.tile).items():
        assert_close(fn(*inputs), expected, dtype, what=name)
        ms = _time_ms(lambda fn=fn: fn(*inputs), device, args.repeats)
        rows.append({"context": context, "impl": name, "ms": round(ms, 4), "GB/s": round(kv_bytes / ms / 1e6, 1)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--contexts", default="128,512,2048")
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    parser.add_argument("--tile", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20, help="CPU only; on CUDA triton.testing.do_bench decides")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda":
        print("CUDA is not available: timing the PyTorch reference only (the CPU engine's path), in float32.")
    rows = [row for context in map(int, args.contexts.split(",")) for row in _run_context(args, context, device)]

    print(f"{'context':>8} {'implementation':>20} {'ms':>9} {'GB/s':>8}")
    for row in rows:
        print(f"{row['context']:>8} {row['impl']:>20} {row['ms']:>9.3f} {row['GB/s']:>8.1f}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(json.dumps({"benchmark": "decode_kernel", "device": name, "torch": torch.__version__,
                      "config": {k: v for k, v in vars(args).items() if k != "repeats"}, "rows": rows}))


if __name__ == "__main__":
    main()
