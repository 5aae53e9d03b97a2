"""Engine throughput on CPU, side by side in one run: continuous vs static batching vs transformers.

Workload: 32 requests with varied prompt lengths (16-256 tokens) and forced output lengths (8-128 tokens,
log-uniform), all arriving at once. Compared on the same requests, greedy, fp32:

* transformers `generate`, request by request (batch 1);
* the engine with static batching (a batch of up to 16 runs until all of it finishes);
* the engine with continuous batching (up to 16 sequences join and leave every step).

Also batch-1 decode speed: one request of 128 tokens, engine vs transformers.

    .venv/bin/python benchmarks/bench_engine_throughput.py [--requests 32] [--max-num-seqs 16]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import workbench
from workbench.bench import run_workload
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.workloads import mixed_lengths


def hf_generate(reference, ids: list[int], n: int) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 pad_token_id=2)
    assert out.shape[1] - len(ids) == n
    return time.perf_counter() - start


def engine_for(model, tokenizer, mode: str, max_num_seqs: int) -> LLMEngine:
    return LLMEngine(model, tokenizer, cache_config=CacheConfig(),
                     scheduler_config=SchedulerConfig(batching=mode, max_num_seqs=max_num_seqs,
                                                      max_num_batched_tokens=512))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    args = parser.parse_args()
    model, tokenizer = workbench.load_model(device="cpu")
    reference = workbench.load_reference_model(device="cpu")
    workload = mixed_lengths(args.requests, seed=0)
    total_out = sum(r.max_tokens for r in workload)

    results = {}
    for mode in ("continuous", "static"):
        engine = engine_for(model, tokenizer, mode, args.max_num_seqs)
        run_workload(engine, workload[:2], realtime=False, progress=False)  # warm-up
        res = run_workload(engine, workload, realtime=False, progress=False)
        assert int(res.requests["output_tokens"].sum()) == total_out
        results[mode] = total_out / res.wall_s
    hf_generate(reference, workload[0].prompt, 4)  # warm-up
    hf_seconds = sum(hf_generate(reference, r.prompt, r.max_tokens) for r in workload)
    results["transformers"] = total_out / hf_seconds

    # Batch-1 decode: a single 128-token request, prefill excluded from both (time from first token on).
    engine = engine_for(model, tokenizer, "continuous", 1)
    single = workload[0].prompt
    engine.generate([single], SamplingParams(max_tokens=129, ignore_eos=True), progress=False, chat=False)
    row = engine.metrics.request_frame().iloc[-1]
    engine_decode = 128 / (row["finish"] - row["first_token"])
    hf_decode = 128 / (hf_generate(reference, single, 129) - hf_generate(reference, single, 1))

    print(f"{'system':>14} {'output tok/s':>13} {'vs transformers':>16}")
    for name in ("continuous", "static", "transformers"):
        print(f"{name:>14} {results[name]:>13.1f} {results[name] / results['transformers']:>15.2f}x")
    print(f"continuous / static: {results['continuous'] / results['static']:.2f}x")
    print(f"batch-1 decode tok/s: engine {engine_decode:.1f}, transformers {hf_decode:.1f}, "
          f"ratio {engine_decode / hf_decode:.2f}x")
    print(json.dumps({
        "benchmark": "engine_throughput", "device": "cpu", "threads": torch.get_num_threads(),
        "requests": args.requests, "output_tokens": total_out, "max_num_seqs": args.max_num_seqs,
        "tok_s_continuous": round(results["continuous"], 1), "tok_s_static": round(results["static"], 1),
        "tok_s_transformers": round(results["transformers"], 1),
        "continuous_over_transformers": round(results["continuous"] / results["transformers"], 2),
        "continuous_over_static": round(results["continuous"] / results["static"], 2),
        "batch1_decode_engine": round(engine_decode, 1), "batch1_decode_transformers": round(hf_decode, 1),
        "batch1_decode_ratio": round(engine_decode / hf_decode, 2)}))


if __name__ == "__main__":
    main()
