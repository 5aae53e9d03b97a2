"""What prompt log-probabilities cost: one prompt's time to its first token, computed cold, read from the prefix
cache, and with ``prompt_logprobs`` (which skips the prefix cache, as in vLLM, and runs the LM head over every
prompt row instead of the last).

Each round builds a fresh engine and runs the same prompt three times, one at a time: cold (nothing cached), again
(its blocks are cached: only the last block's tail is computed), again with ``prompt_logprobs=0`` (recomputed, every
row through the LM head). The medians over the rounds are printed, with every round, as one JSON line.

    .venv/bin/python benchmarks/bench_prompt_logprobs.py [--tokens 513] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import workbench
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine

TEXT = Path(__file__).resolve().parents[1] / "datasets" / "eval" / "heldout.txt"


def first_token_s(engine: LLMEngine, ids: list[int], params: SamplingParams, request_id: str) -> float:
    start = time.perf_counter()
    engine.add_request(ids, params, request_id=request_id)
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=513)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model, tokenizer = workbench.load_model("smollm2-135m", dtype=torch.float32, device="cpu")
    ids = tokenizer(TEXT.read_text(), add_special_tokens=False)["input_ids"][: args.tokens]
    runs: dict[str, list[float]] = {"cold": [], "prefix_cache_hit": [], "prompt_logprobs": []}
    for round_ in range(args.rounds):
        engine = LLMEngine(model, tokenizer, cache_config=CacheConfig(num_blocks=128),
                           scheduler_config=SchedulerConfig(max_num_batched_tokens=max(1024, args.tokens)))
        runs["cold"].append(first_token_s(engine, ids, SamplingParams(max_tokens=1), f"cold-{round_}"))
        runs["prefix_cache_hit"].append(first_token_s(engine, ids, SamplingParams(max_tokens=1), f"hit-{round_}"))
        runs["prompt_logprobs"].append(first_token_s(engine, ids, SamplingParams(max_tokens=1, prompt_logprobs=0),
                                                     f"logprobs-{round_}"))
    for name, values in runs.items():
        print(f"{name:18s} median {statistics.median(values) * 1e3:8.0f} ms  rounds "
              f"{[round(v * 1e3) for v in values]}")
    print(json.dumps({"tokens": len(ids), "threads": torch.get_num_threads(),
                      **{f"{name}_ms": [round(v * 1e3, 1) for v in values] for name, values in runs.items()}}))


if __name__ == "__main__":
    main()
