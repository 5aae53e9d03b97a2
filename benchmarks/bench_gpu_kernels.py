"""The Triton attention kernels on a GPU against the device's own measured limits, in one run.

Why it exists: a kernel's speed means little alone. Decode attention reads the KV cache once and does little
arithmetic, so its ceiling is memory bandwidth: the table gives each configuration's bytes read per second as a
share of a large device-to-device copy measured in the same run (bytes read + written, the usual convention).
Prefill attention is arithmetic-bound at long prompts, so its row gives TFLOP/s beside a large bf16 matrix
product's and beside PyTorch's own fused attention (flash) on the same tensors. Quantized KV caches read fewer
bytes, so their decode time is reported as a ratio to bf16's. Every configuration is checked against a
float32 reference before it is timed; the sweep over tile size and ``num_warps`` is the tuning record behind
the kernels' default constants.

    PYTHONPATH=. python benchmarks/bench_gpu_kernels.py [--quick] [--json out.json]

CUDA only (it says so and exits elsewhere); timings are ``triton.testing.do_bench`` medians.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from bench_decode_kernel import _format_bytes_per_key, _format_case  # noqa: E402
from kernel_testing import assert_close, query_start_loc, random_paged_kv, random_queries  # noqa: E402

from workbench.intmath import ceil_div
from workbench_kernels.paged_decode_attention import (  # noqa: E402
    paged_decode_attention_reference,
    paged_decode_attention_triton,
)
from workbench_kernels.paged_prefill_attention import paged_prefill_attention_triton  # noqa: E402

# Llama-3-8B's attention shape: 32 query heads over 8 KV heads (GQA 4:1), head_dim 128.
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
DECODE_SHAPES = [(64, 4096), (32, 8192), (128, 2048), (8, 32768)]  # (sequences, context)
PREFILL_SHAPES = [(1, 8192), (4, 4096), (16, 1024)]  # (sequences, prompt length)


def _ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def measure_peaks() -> dict:
    """Copy bandwidth (2 GiB bf16 buffer, bytes read + written) and a random 8192^3 bf16 matmul's TFLOP/s."""
    src = torch.randn(2**30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = _ms(lambda src=src, dst=dst: dst.copy_(src))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = _ms(lambda: a @ b)
    return {"copy_GBps": round(2 * 2**31 / copy_ms / 1e6, 1), "matmul_bf16_TFLOPs": round(2 * 8192**3 / mm_ms / 1e9, 1)}


def decode_rows(peaks: dict, quick: bool) -> list[dict]:
    rows = []
    tiles, warps = ((64,), (4,)) if quick else ((32, 64, 128), (2, 4, 8))
    for seqs, context in DECODE_SHAPES[:2] if quick else DECODE_SHAPES:
        kv = random_paged_kv([context] * seqs, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=BLOCK,
                             dtype=torch.bfloat16, seed=0, device="cuda")
        query = random_queries(seqs, HEADS, HEAD_DIM, torch.bfloat16, seed=1, device="cuda")
        inputs = (query, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens, HEAD_DIM**-0.5)
        expected = paged_decode_attention_reference(query.float(), kv.key_cache.float(), kv.value_cache.float(),
                                                    kv.block_tables, kv.context_lens, HEAD_DIM**-0.5)
        kv_bytes = 2 * seqs * context * KV_HEADS * HEAD_DIM * 2
        for tile, nw in itertools.product(tiles, warps):
            call = lambda tile=tile, nw=nw, inputs=inputs: paged_decode_attention_triton(
                *inputs, tile_size=tile, num_warps=nw)  # noqa: E731
            assert_close(call(), expected, torch.bfloat16, what=f"decode {seqs}x{context} tile {tile} warps {nw}")
            ms = _ms(call)
            gbps = kv_bytes / ms / 1e6
            rows.append({"seqs": seqs, "context": context, "tile": tile, "num_warps": nw, "ms": round(ms, 4),
                         "GBps": round(gbps, 1), "pct_of_copy": round(100 * gbps / peaks["copy_GBps"], 1)})
        torch.cuda.empty_cache()
    return rows


def format_rows(quick: bool) -> list[dict]:
    """fp8 / int8 / int4 decode time against bf16 on the same values, each at its best tile."""
    seqs, context = (16, 4096) if quick else (32, 8192)
    args = SimpleNamespace(seqs=seqs, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=BLOCK,
                           dtype="bfloat16")
    rows, base = [], None
    for kv_format in ("auto", "fp8_e4m3", "int8", "int4"):
        inputs, fmt, expected, dtype = _format_case(args, kv_format, context, torch.device("cuda"))
        best = None
        for tile, nw in itertools.product((32, 64, 128), (4,) if quick else (2, 4, 8)):
            call = lambda tile=tile, nw=nw, inputs=inputs, fmt=fmt: paged_decode_attention_triton(  # noqa: E731
                *inputs, **fmt, tile_size=tile, num_warps=nw)
            assert_close(call(), expected, dtype, what=f"decode {kv_format} tile {tile} warps {nw}")
            ms = _ms(call)
            if best is None or ms < best[0]:
                best = (ms, tile, nw)
        base = base or best[0]
        kv_bytes = 2 * seqs * context * _format_bytes_per_key(kv_format, args)
        rows.append({"format": kv_format, "seqs": seqs, "context": context, "tile": best[1], "num_warps": best[2],
                     "ms": round(best[0], 4), "GBps": round(kv_bytes / best[0] / 1e6, 1),
                     "vs_bf16": round(best[0] / base, 3)})
        torch.cuda.empty_cache()
    return rows


def prefill_rows(peaks: dict, quick: bool) -> list[dict]:
    rows = []
    configs = [(64, 64, 4)] if quick else list(itertools.product((64, 128), (32, 64, 128), (4, 8)))
    for seqs, length in PREFILL_SHAPES[:1] if quick else PREFILL_SHAPES:
        kv = random_paged_kv([length] * seqs, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=BLOCK,
                             dtype=torch.bfloat16, seed=0, device="cuda")
        query = random_queries(seqs * length, HEADS, HEAD_DIM, torch.bfloat16, seed=1, device="cuda")
        starts = query_start_loc([length] * seqs, device="cuda")
        inputs = (query, kv.key_cache, kv.value_cache, kv.block_tables, starts, kv.context_lens, HEAD_DIM**-0.5)
        # The same keys contiguous, for PyTorch's fused attention (the reference and the speed yardstick).
        blocks = ceil_div(length, BLOCK)
        keys = torch.stack([kv.key_cache[kv.block_tables[i, :blocks].long()].reshape(-1, KV_HEADS, HEAD_DIM)[:length]
                            for i in range(seqs)]).transpose(1, 2)
        values = torch.stack([kv.value_cache[kv.block_tables[i, :blocks].long()].reshape(-1, KV_HEADS,
                              HEAD_DIM)[:length] for i in range(seqs)]).transpose(1, 2)
        q4 = query.view(seqs, length, HEADS, HEAD_DIM).transpose(1, 2)

        def sdpa(q4=q4, keys=keys, values=values):
            return torch.nn.functional.scaled_dot_product_attention(q4, keys, values, is_causal=True, enable_gqa=True)

        expected = torch.nn.functional.scaled_dot_product_attention(
            q4.float(), keys.float(), values.float(), is_causal=True, enable_gqa=True)
        expected = expected.transpose(1, 2).reshape(seqs * length, HEADS, HEAD_DIM)
        flops = 4 * HEADS * HEAD_DIM * seqs * length * (length + 1) / 2  # QK^T and PV over the causal triangle
        sdpa_ms = _ms(sdpa)
        for block_m, tile, nw in configs:
            call = lambda bm=block_m, t=tile, nw=nw, inputs=inputs: paged_prefill_attention_triton(  # noqa: E731
                *inputs, block_m=bm, tile_size=t, num_warps=nw)
            assert_close(call(), expected, torch.bfloat16, what=f"prefill {seqs}x{length} {block_m}/{tile}/{nw}")
            ms = _ms(call)
            rows.append({"seqs": seqs, "length": length, "block_m": block_m, "tile": tile, "num_warps": nw,
                         "ms": round(ms, 4), "TFLOPs": round(flops / ms / 1e9, 1),
                         "pct_of_matmul": round(100 * flops / ms / 1e9 / peaks["matmul_bf16_TFLOPs"], 1),
                         "sdpa_ms": round(sdpa_ms, 4), "sdpa_TFLOPs": round(flops / sdpa_ms / 1e9, 1)})
        torch.cuda.empty_cache()
    return rows


def _best(rows: list[dict], keys: tuple[str, ...]) -> list[dict]:
    best: dict[tuple, dict] = {}
    for row in rows:
        k = tuple(row[x] for x in keys)
        if k not in best or row["ms"] < best[k]["ms"]:
            best[k] = row
    return list(best.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one configuration per kernel, fewer shapes")
    parser.add_argument("--json", default=None, help="write every row here")
    parser.add_argument("--parts", default="decode,formats,prefill", help="which measurements to run")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("CUDA is not available: this benchmark measures the Triton kernels on a GPU only.")
        return
    import triton

    parts = set(args.parts.split(","))
    peaks = measure_peaks()
    result = {"benchmark": "gpu_kernels", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "peaks": peaks,
              "decode": decode_rows(peaks, args.quick) if "decode" in parts else [],
              "formats": format_rows(args.quick) if "formats" in parts else [],
              "prefill": prefill_rows(peaks, args.quick) if "prefill" in parts else []}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"{result['device']}, torch {result['torch']}, triton {result['triton']}: copy {peaks['copy_GBps']} GB/s "
          f"(read + written), bf16 matmul {peaks['matmul_bf16_TFLOPs']} TFLOP/s")
    print("decode (bf16, 32 q / 8 kv heads, d 128): all configurations")
    for r in result["decode"]:
        print(f"  {r['seqs']:>4} x {r['context']:>6}  tile {r['tile']:>3} warps {r['num_warps']}  {r['ms']:8.4f} ms"
              f"  {r['GBps']:7.1f} GB/s  {r['pct_of_copy']:5.1f}% of copy")
    print("decode, best per shape:" if result["decode"] else "")
    for r in _best(result["decode"], ("seqs", "context")):
        print(f"  {r['seqs']:>4} x {r['context']:>6}  tile {r['tile']} warps {r['num_warps']}: {r['GBps']} GB/s = "
              f"{r['pct_of_copy']}% of copy")
    print("KV formats (best tile/warps each):")
    for r in result["formats"]:
        print(f"  {r['format']:>9} {r['seqs']} x {r['context']}: {r['ms']:.4f} ms, {r['GBps']} GB/s, "
              f"{r['vs_bf16']:.3f} x bf16")
    print("prefill (bf16, causal): best per shape")
    for r in _best(result["prefill"], ("seqs", "length")):
        print(f"  {r['seqs']:>3} x {r['length']:>5}  bm {r['block_m']} tile {r['tile']} warps {r['num_warps']}: "
              f"{r['TFLOPs']} TFLOP/s ({r['pct_of_matmul']}% of matmul); torch SDPA {r['sdpa_TFLOPs']} TFLOP/s")


if __name__ == "__main__":
    main()
