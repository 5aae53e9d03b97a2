"""Paged decode attention: Triton kernel (one split, flash-decoding splits) vs the PyTorch CPU path, side by side.

Why it exists: decode attention is bound by reading the KV cache, so the table reports the bandwidth each version
reaches (K and V bytes read / time) next to its time, for a sweep of context lengths, and checks every result
against the float32 reference (the specification) before timing it. Without CUDA it says so and times only the
vectorized CPU path (``paged_decode_attention_cpu``), which is what the CPU engine runs.

``--formats auto,fp8_e4m3,int8,int4`` times the same decode step per KV-cache format instead (each quantized
cache checked against the float reference on its dequantized twin first); bandwidth then counts the bytes each
format really reads, scales included. Without CUDA only the CPU path runs (the Triton rows need CUDA), and the
ratio column compares each format's CPU path with ``auto``'s: the cost of dequantizing in PyTorch.

    .venv/bin/python benchmarks/bench_decode_kernel.py [--seqs 32] [--contexts 128,512,2048]
        [--heads 9] [--kv-heads 3] [--head-dim 64] [--block-size 16] [--dtype bfloat16] [--tile 64]
        [--formats auto,fp8_e4m3,int8,int4]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from workbench_kernels.kv_quant import KV_FORMATS, cache_shapes
from workbench_kernels.paged_decode_attention import (
    paged_decode_attention_cpu,
    paged_decode_attention_reference,
    paged_decode_attention_triton,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the kernel tests' input generators
from kernel_testing import assert_close, random_paged_kv, random_queries, upcast  # noqa: E402
from kernel_testing_quant import random_quantized_paged_kv  # noqa: E402

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
    impls = {"cpu path (SDPA)": paged_decode_attention_cpu}
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


def _format_bytes_per_key(kv_format: str, args) -> int:
    """Bytes of one key (or value) across the KV heads, per-slot scales included (fp8's per-head scale is not)."""
    layout = cache_shapes(kv_format, 1, 1, args.kv_heads, args.head_dim, DTYPES[args.dtype])
    total = torch.empty(layout["data_shape"], dtype=layout["data_dtype"]).nbytes
    if layout["scale_per_slot"]:
        total += torch.empty(layout["scale_shape"], dtype=layout["scale_dtype"]).nbytes
    return total


def _format_case(args, kv_format: str, context: int, device: torch.device):
    """Inputs, format keywords and the float32 expected output of one format's decode step.

    ``auto`` runs on the float twin of a quantized cache (in the query's dtype): all formats see the same values."""
    dtype = DTYPES[args.dtype] if device.type == "cuda" else torch.float32
    qkv = random_quantized_paged_kv([context] * args.seqs, "int8" if kv_format == "auto" else kv_format,
                                    num_kv_heads=args.kv_heads, head_dim=args.head_dim, block_size=args.block_size,
                                    seed=0, device=device)
    query = random_queries(args.seqs, args.heads, args.head_dim, dtype, seed=1, device=device)
    seen = qkv.float_twin if kv_format == "auto" else qkv.dequantized(dtype)  # what the kernel reads, as floats
    keys, values = seen.key_cache.to(dtype), seen.value_cache.to(dtype)
    expected = paged_decode_attention_reference(*upcast(query.cpu(), keys, values), seen.block_tables,
                                                seen.context_lens, args.head_dim**-0.5)
    if kv_format == "auto":
        caches, fmt = (keys.to(device), values.to(device)), {}
    else:
        caches, fmt = (qkv.key_cache, qkv.value_cache), qkv.format_args()
    inputs = (query, *caches, qkv.block_tables, qkv.context_lens, args.head_dim**-0.5)
    return inputs, fmt, expected, dtype


def _run_formats(args, context: int, device: torch.device) -> list[dict]:
    rows, base_ms = [], {}
    for kv_format in args.formats.split(","):
        inputs, fmt, expected, dtype = _format_case(args, kv_format, context, device)
        kv_bytes = 2 * args.seqs * context * _format_bytes_per_key(kv_format, args)
        for name, fn in _implementations(device, args.tile).items():
            call = lambda fn=fn, inputs=inputs, fmt=fmt: fn(*inputs, **fmt)  # noqa: E731
            assert_close(call(), expected, dtype, what=f"{name} {kv_format}")
            ms = _time_ms(call, device, args.repeats)
            base_ms.setdefault(name, ms)  # auto comes first: the baseline of each implementation
            rows.append({"context": context, "format": kv_format, "impl": name, "ms": round(ms, 4),
                         "GB/s": round(kv_bytes / ms / 1e6, 1), "vs_auto": round(ms / base_ms[name], 2)})
    return rows


def _print_rows(rows: list[dict]) -> None:
    with_formats = "format" in rows[0]
    print(f"{'context':>8} {'format':>9} {'implementation':>20} {'ms':>9} {'GB/s':>8} {'vs auto':>8}"
          if with_formats else f"{'context':>8} {'implementation':>20} {'ms':>9} {'GB/s':>8}")
    for row in rows:
        head = f"{row['context']:>8} " + (f"{row['format']:>9} " if with_formats else "")
        tail = f" {row['vs_auto']:>8.2f}" if with_formats else ""
        print(f"{head}{row['impl']:>20} {row['ms']:>9.3f} {row['GB/s']:>8.1f}{tail}")


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
    parser.add_argument("--formats", default=None,
                        help=f"comma-separated KV formats to compare ({','.join(KV_FORMATS)}); auto first")
    args = parser.parse_args()
    if args.formats is not None:
        names = args.formats.split(",")
        if names[0] != "auto" or not set(names) <= set(KV_FORMATS):
            parser.error(f"--formats must start with auto and name only {', '.join(KV_FORMATS)}")

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda":
        print("CUDA is not available: timing the PyTorch CPU path only (the CPU engine's), in float32; "
              "the Triton rows need CUDA.")
    run = _run_context if args.formats is None else _run_formats
    rows = [row for context in map(int, args.contexts.split(",")) for row in run(args, context, device)]
    _print_rows(rows)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(json.dumps({"benchmark": "decode_kernel", "device": name, "torch": torch.__version__,
                      "config": {k: v for k, v in vars(args).items() if k != "repeats"}, "rows": rows}))


if __name__ == "__main__":
    main()
