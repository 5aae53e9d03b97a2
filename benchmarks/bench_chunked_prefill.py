"""Chunked prefill bounds decode stalls: max inter-token latency of running requests when a long prompt lands.

Four short requests are decoding when a 1,024-token prompt arrives. Without chunking, the step that prefills
it holds every decoder for the whole prefill; with chunking, the prompt is split across steps under a token
budget and the decoders keep getting a token every step. Both runs in one process, same requests.

    .venv/bin/python benchmarks/bench_chunked_prefill.py [--long-prompt 1024] [--chunk 128]
"""

from __future__ import annotations

import argparse
import json

import torch

import workbench
from workbench.bench import run_workload
from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.workloads import long_prompt_among_decoders


def run(model, tokenizer, workload, chunked: bool, chunk: int, budget: int) -> dict:
    config = SchedulerConfig(enable_chunked_prefill=chunked, max_num_batched_tokens=budget if chunked else 2048,
                             max_prefill_chunk=chunk if chunked else None)
    engine = LLMEngine(model, tokenizer, cache_config=CacheConfig(), scheduler_config=config)
    run_workload(engine, workload[:1], realtime=False, progress=False)  # warm-up
    result = run_workload(engine, workload, realtime=True, progress=False)
    decoders = result.requests[result.requests["prompt_tokens"] < 100]
    long_row = result.requests[result.requests["prompt_tokens"] >= 100].iloc[0]
    return {"max_itl_ms": float(decoders["max_itl_s"].max() * 1e3),
            "p99_itl_ms": float(result.itl[result.itl["request_id"].isin(decoders["request_id"])]["itl_s"]
                                .quantile(0.99) * 1e3),
            "long_ttft_ms": float(long_row["ttft_s"] * 1e3), "steps": len(result.steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long-prompt", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--budget", type=int, default=160)
    args = parser.parse_args()
    model, tokenizer = workbench.load_model(device="cpu")
    workload = long_prompt_among_decoders(4, long_prompt=args.long_prompt, decoder_tokens=64, arrival_s=0.5)
    off = run(model, tokenizer, workload, False, args.chunk, args.budget)
    on = run(model, tokenizer, workload, True, args.chunk, args.budget)
    print(f"{'chunked prefill':>16} {'max ITL ms':>11} {'p99 ITL ms':>11} {'long-prompt TTFT ms':>20} {'steps':>6}")
    for name, r in (("off", off), (f"on (chunk {args.chunk})", on)):
        print(f"{name:>16} {r['max_itl_ms']:>11.1f} {r['p99_itl_ms']:>11.1f} {r['long_ttft_ms']:>20.1f} "
              f"{r['steps']:>6}")
    print(f"max ITL of decoders: {off['max_itl_ms'] / on['max_itl_ms']:.1f}x lower with chunking")
    print(json.dumps({"benchmark": "chunked_prefill_stall", "device": "cpu", "threads": torch.get_num_threads(),
                      "long_prompt_tokens": args.long_prompt, "chunk": args.chunk, "budget": args.budget,
                      "max_itl_ms_off": round(off["max_itl_ms"], 1), "max_itl_ms_on": round(on["max_itl_ms"], 1),
                      "ratio": round(off["max_itl_ms"] / on["max_itl_ms"], 2),
                      "long_ttft_ms_off": round(off["long_ttft_ms"], 1),
                      "long_ttft_ms_on": round(on["long_ttft_ms"], 1)}))


if __name__ == "__main__":
    main()
