"""The CPU products for GGUF blocks at SmolLM2-135M's shapes: what `workbench.models.gguf_cpu` chose, and why.

Rows: the C++ extension (`gguf_cpu.cpp`), torch's packed int4 kernel with the Q4_1 blocks mapped exactly (scale d,
zero m + 8 d, float32 activations: the only exact mapping), the same kernel in its fast form (bfloat16
activations and scales: not exact, shown for what it costs), the reference (dequantize, then ``F.linear``),
oneDNN's packed float32 product (the ``auto`` weights) and dequantize-then-GEMM (what the fallbacks do past
``DIRECT_ROWS`` rows; the C++ product beat it at every row count). Each is timed over all 30 layers' distinct
weights in turn (a decode step's access pattern: the 66 MB of Q4_1 blocks do not fit the cache), best of
``--reps``, at 1 to a few hundred activation rows (``--rows``).

    .venv/bin/python benchmarks/bench_gguf_cpu.py [--threads 2] [--rows 1,2,4,8,64,512] [--reps 5] [--layers 30]

Prints milliseconds per 120 decoder products (and per LM head product) and GB/s of weight bytes read.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from workbench.models import gguf_cpu
from workbench.models.cpu_linear import _pack
from workbench.models.gguf_linear import DIRECT_ROWS, quantize_blocks
from workbench_kernels.gguf_matmul import block_fields, dequantize_blocks

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down
HEAD = (49152, 576)


def _layers(count: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(count):
        for n, k in SHAPES:
            blocks = quantize_blocks(torch.randn(n, k, generator=gen) * 0.05, "q4_1")
            layers.append({"blocks": blocks, "k": k, "n": n})
    return layers


def _best_ms(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def products(layers: list[dict], rows: int, reps: int, skip_slow: bool) -> dict[str, float]:
    xs = {k: torch.randn(rows, k) for k in (576, 1536)}
    ops = torch.ops.workbench_gguf
    out = {"cpp": _best_ms(lambda: [ops.linear(xs[w["k"]], w["blocks"], 3) for w in layers], reps),
           "dequantize + GEMM": _best_ms(lambda: [F.linear(xs[w["k"]], ops.dequantize(w["blocks"], 3, w["k"]))
                                                  for w in layers], reps),
           "oneDNN float32 (packed)": _best_ms(lambda: [torch.ops.mkldnn._linear_pointwise(
               xs[w["k"]], w["packed"], None, "none", [], "") for w in layers], reps)}
    if not skip_slow:  # the exact int4 mapping takes ~20 ms per product: one layer, scaled to 30
        one = layers[:4]
        scale = len(layers) / len(one)
        out["torch int4pack, exact (float32)"] = scale * _best_ms(
            lambda: [gguf_cpu.int4pack_linear(xs[w["k"]], w["int4"]) for w in one], 1)
        out["reference (dequantize in torch)"] = scale * _best_ms(
            lambda: [F.linear(xs[w["k"]], dequantize_blocks(w["blocks"], "q4_1")) for w in one], 1)
    xb = {k: x.bfloat16() for k, x in xs.items()}
    out["torch int4pack, bf16 (not exact)"] = _best_ms(
        lambda: [torch._weight_int4pack_mm_for_cpu(xb[w["k"]], w["int4_bf16"], 32, w["sz_bf16"]) for w in layers],
        reps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,4,8,64,512")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    status = gguf_cpu.extension()
    if not status.loaded:
        raise SystemExit(f"the extension is not available: {status.reason}")
    layers = _layers(args.layers)
    for layer in layers:
        d, m, codes = block_fields(layer["blocks"], "q4_1")
        layer["int4"] = gguf_cpu.int4pack_weights(codes, d, m)
        layer["packed"] = _pack(dequantize_blocks(layer["blocks"], "q4_1"))
        layer["int4_bf16"] = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 8)
        layer["sz_bf16"] = layer["int4"][1].bfloat16()
    block_bytes = sum(layer["blocks"].numel() for layer in layers)
    print(f"{os.cpu_count()} cores, {args.threads} threads, extension {status.vector_path}, load "
          f"{os.getloadavg()[0]:.2f}; {len(layers)} products over {block_bytes / 1e6:.1f} MB of Q4_1 blocks; "
          f"the fallbacks' DIRECT_ROWS = {DIRECT_ROWS}")
    for rows in (int(r) for r in args.rows.split(",")):
        timings = products(layers, rows, args.reps, skip_slow=rows > 1)
        for name, ms in timings.items():
            print(f"  M={rows}  {name:34s} {ms:9.2f} ms  {block_bytes / ms / 1e6:6.1f} GB/s of Q4_1 bytes")
    head = quantize_blocks(torch.randn(*HEAD) * 0.05, "q8_0")
    x = torch.randn(1, HEAD[1])
    ms = _best_ms(lambda: torch.ops.workbench_gguf.linear(x, head, 8), args.reps)
    print(f"  LM head Q8_0 {HEAD[0]}x{HEAD[1]}, M=1: {ms:.2f} ms, {head.numel() / ms / 1e6:.1f} GB/s")


if __name__ == "__main__":
    main()
