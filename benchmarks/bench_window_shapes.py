"""Sliding windows on real model shapes: memory and speed of the engine's KV groups against full attention, on a
GPU, with random weights (shapes decide memory and time; never read quality from these).

Two shapes, each run twice side by side in one process on the same workload, once with the model's own pattern of
windows and once with full attention in every layer (both through the KV-group path, both eager):

- ``gemma-3-27b``: Gemma 3 27B's per-layer shapes (hidden 5,376, 32 query / 16 KV heads of 128, MLP 21,504) in
  the Llama block of this engine, 12 of its 62 layers keeping its pattern (a 1,024-token window in five layers of
  six);
- ``mistral-7b``: Mistral 7B's shapes, 8 of 32 layers, its 4,096-token window in every layer.

For each: how many sequences of the workload's length the same KV budget holds (the pool's blocks over what one
sequence takes, `KVGroupLayout.blocks_needed`), the KV bytes the engine really held at its peak, prefill
throughput, and the median decode step.

    PYTHONPATH=.:<dir with workbench_kernels> python benchmarks/bench_window_shapes.py [--context 16384]
        [--batch 8] [--new-tokens 64] [--json out.json]
    python benchmarks/bench_window_shapes.py --device cpu --tiny     # the dry run: same code, tiny shapes

Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import workbench
from workbench.cache.kv_layout import kv_layout
from workbench.config import CacheConfig, ModelSpec, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.intmath import ceil_div

TINY = dict(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=256)


def gemma_shape(num_layers: int) -> ModelSpec:
    """Gemma 3 27B's attention and MLP shapes in the Llama block (`datasets/configs/gemma-3-27b.json`)."""
    layout = kv_layout("gemma-3-27b")
    sliding = layout.group("sliding")
    types = tuple("full_attention" if i % 6 == 5 else "sliding_attention" for i in range(num_layers))
    return ModelSpec(name="gemma-3-27b-shape", vocab_size=262208, hidden_size=5376, intermediate_size=21504,
                     num_layers=num_layers, num_heads=layout.num_query_heads, num_kv_heads=sliding.kv_heads,
                     head_dim=sliding.head_dim, max_position_embeddings=layout.max_position_embeddings,
                     rope_theta=1e6, sliding_window=sliding.window, layer_types=types)


def mistral_shape(num_layers: int) -> ModelSpec:
    spec = workbench.model_spec("mistral-7b")
    return spec.replace(name="mistral-7b-shape", num_layers=num_layers,
                        layer_types=("sliding_attention",) * num_layers)


def run_variant(spec: ModelSpec, device: str, dtype: torch.dtype, prompts: list[list[int]], new_tokens: int,
                budget_bytes: int, chunk: int) -> dict:
    model = workbench.random_model(spec, device=device, dtype=dtype, seed=0)
    engine = LLMEngine(model, cache_config=CacheConfig(memory_budget_bytes=budget_bytes, enable_prefix_caching=False),
                       scheduler_config=SchedulerConfig(max_num_batched_tokens=max(chunk, len(prompts)),
                                                        max_prefill_chunk=chunk, max_num_seqs=len(prompts)))
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    # Compile every kernel variant the timed run meets (long contexts take flash-decoding splits) before timing.
    engine.generate(prompts[:2], SamplingParams(max_tokens=2, ignore_eos=True), progress=False)
    engine.metrics.reset()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    engine.generate(prompts, params, progress=False)
    total = time.perf_counter() - start
    steps = engine.metrics.steps
    prefill = [s for s in steps if s.num_prefill_tokens]
    decode = [s.duration_s for s in steps if not s.num_prefill_tokens]
    length = len(prompts[0]) + new_tokens
    per_seq = engine.limits.blocks_for(length) if engine.limits.blocks_for else ceil_div(length, 16)
    row = {"model": spec.name, "attention": "windows" if "sliding_attention" in spec.layer_types else "full",
           "layers": spec.num_layers, "kv_groups": engine.blocks.num_groups,
           "bytes_per_block": engine.cache.bytes_per_block, "pool_blocks": engine.blocks.num_blocks,
           "blocks_per_sequence": per_seq, "sequences_that_fit": engine.blocks.num_blocks // per_seq,
           "peak_kv_GiB": max(s.kv_blocks_used for s in steps) * engine.cache.bytes_per_block / 2**30,
           "prefill_tokens_per_s": sum(s.num_prefill_tokens for s in prefill) / sum(s.duration_s for s in prefill),
           "decode_step_ms": 1e3 * statistics.median(decode) if decode else float("nan"),
           "total_s": total}
    del engine, model
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, for the CPU dry run")
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=2048, help="prompt tokens of one sequence per step")
    parser.add_argument("--budget-gib", type=float, default=16.0, help="KV budget of every variant")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    shapes = [gemma_shape(12), mistral_shape(8)]
    if args.tiny:
        shapes = [s.replace(**TINY, sliding_window=min(s.sliding_window, 32), num_layers=6,
                            layer_types=s.layer_types[:6]) for s in shapes]
        args.context, args.batch, args.new_tokens, args.chunk, args.budget_gib = 200, 3, 8, 64, 0.05
    rows = []
    for spec in shapes:
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, spec.vocab_size, (args.context,), generator=gen).tolist()
                   for _ in range(args.batch)]
        for variant in (spec, spec.replace(layer_types=("full_attention",) * spec.num_layers)):
            rows.append(run_variant(variant, args.device, dtype, prompts, args.new_tokens,
                                    int(args.budget_gib * 2**30), args.chunk))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}), {dtype}, "
          f"{args.batch} x {args.context:,}-token prompts + {args.new_tokens} tokens, KV budget "
          f"{args.budget_gib:g} GiB")
    print(f"{'shape':<20}{'attention':<10}{'fits':>6}{'peak KV GiB':>13}{'prefill tok/s':>15}{'decode ms':>11}")
    for r in rows:
        print(f"{r['model']:<20}{r['attention']:<10}{r['sequences_that_fit']:>6}{r['peak_kv_GiB']:>13.2f}"
              f"{r['prefill_tokens_per_s']:>15,.0f}{r['decode_step_ms']:>11.1f}")
    summary = {"device": args.device, "context": args.context, "batch": args.batch, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
