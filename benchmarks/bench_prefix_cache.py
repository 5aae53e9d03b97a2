"""Prefix caching: TTFT of requests sharing a ~1,000-token system prompt, cache hit vs miss, in one run.

Requests run one at a time (so TTFT is the prefill, not queueing). With prefix caching on, the first request
misses and computes the whole prompt; later ones find the system prompt's blocks in the cache and compute only
their own question. The same requests with prefix caching off are the miss baseline.

    .venv/bin/python benchmarks/bench_prefix_cache.py [--requests 6] [--system-tokens 1000]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import workbench
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.prompts import encode_prompt
from workbench.workloads import questions

SYSTEM_SENTENCE = ("You are the support assistant of a bicycle repair shop. Answer politely, cite the relevant "
                   "section of the repair manual, and never invent prices or opening hours. ")


def system_prompt(tokenizer, target_tokens: int) -> str:
    text = ""
    while len(encode_prompt(tokenizer, text or "x", chat=False)) < target_tokens:
        text += SYSTEM_SENTENCE
    return text


def measure(engine: LLMEngine, prompts: list[list[int]]) -> list[tuple[float, int]]:
    results = []
    for ids in prompts:
        out = engine.generate([ids], SamplingParams(max_tokens=1), progress=False)[0]
        row = engine.metrics.request_frame().iloc[-1]
        assert out.finished
        results.append((float(row["ttft_s"]), int(row["cached_prompt_tokens"])))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--system-tokens", type=int, default=1000)
    args = parser.parse_args()
    model, tokenizer = workbench.load_model(device="cpu")
    system = system_prompt(tokenizer, args.system_tokens)
    prompts = [encode_prompt(tokenizer, q, system=system) for q in questions(args.requests, seed=1)]
    rows = {}
    for caching in (True, False):
        engine = LLMEngine(model, tokenizer, cache_config=CacheConfig(enable_prefix_caching=caching),
                           scheduler_config=SchedulerConfig(max_num_batched_tokens=2048))
        measure(engine, prompts[:1])  # warm-up (first forward allocates); then clear what it cached
        engine.blocks.clear_prefix_cache()
        rows[caching] = measure(engine, prompts)
    print(f"{'request':>7} {'prompt tok':>10} {'cached tok':>10} {'TTFT on (ms)':>13} {'TTFT off (ms)':>14}")
    for i, ((on, hit), (off, _)) in enumerate(zip(rows[True], rows[False], strict=True)):
        print(f"{i:>7} {len(prompts[i]):>10} {hit:>10} {on * 1e3:>13.1f} {off * 1e3:>14.1f}")
    miss = rows[True][0][0]
    hits = [t for t, cached in rows[True][1:] if cached > 0]
    off = statistics.median(t for t, _ in rows[False])
    hit = statistics.median(hits)
    print(f"median TTFT: hit {hit * 1e3:.1f} ms, miss (first request) {miss * 1e3:.1f} ms, "
          f"caching off {off * 1e3:.1f} ms; miss/hit {miss / hit:.1f}x, off/hit {off / hit:.1f}x")
    print(json.dumps({"benchmark": "prefix_cache_ttft", "device": "cpu", "threads": torch.get_num_threads(),
                      "system_prompt_tokens": len(encode_prompt(tokenizer, system, chat=False)),
                      "prompt_tokens": len(prompts[0]), "requests": args.requests,
                      "ttft_hit_ms": round(hit * 1e3, 1), "ttft_miss_ms": round(miss * 1e3, 1),
                      "ttft_off_ms": round(off * 1e3, 1), "miss_over_hit": round(miss / hit, 2),
                      "off_over_hit": round(off / hit, 2)}))


if __name__ == "__main__":
    main()
