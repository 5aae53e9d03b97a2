"""Where a batch-1 decode step's time goes, per weight format: decoder layers, LM head, sampling, the loop around.

Why it exists: with the weights in 4-bit blocks the products stop being most of a step, and what is left (the
~25 small operators of each of 30 layers, the 49,152-row LM head, the sampler) decides whether the engine keeps
up with a C++ one. The loop is `workbench.generation.stream_token_ids`'s (one sequence, contiguous KV cache,
greedy), unrolled here so each piece gets its own clock; ``q4_1 plain`` is q4_1 with the fused C++ layers off
(`workbench.models.gguf_layers`), which shows what they remove. Formats run in alternating rounds.

    .venv/bin/python benchmarks/bench_decode_step.py [--threads 2] [--rounds 3] [--tokens 64]
        [--formats auto,int8_all,q4_1,q4_1-plain]

Prints milliseconds per step for each piece (median over rounds) and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from workbench.cache.contiguous import ContiguousKVCache
from workbench.config import SamplingParams
from workbench.models import load_model
from workbench.prompts import encode_prompt
from workbench.sampling import sample
from workbench.timing import describe_cpu

PROMPT = "Write a long story about a lighthouse keeper who finds a map."
PIECES = ("layers", "lm_head", "sampling", "loop")


@torch.inference_mode()
def step_pieces(model, prompt_ids: list[int], tokens: int) -> dict[str, float]:
    """Milliseconds per decode step in each piece, over ``tokens`` greedy steps after the prompt's prefill."""
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    cache = ContiguousKVCache(model.spec, max_batch=1, max_len=len(prompt_ids) + tokens + 1)
    n = len(prompt_ids)
    hidden = model(torch.tensor(prompt_ids), torch.arange(n), cache.attention([0], [0], [n]))
    token = sample(model.compute_logits(hidden[-1:])[0], params)
    spent = dict.fromkeys(PIECES, 0.0)
    start = time.perf_counter()
    for step in range(tokens):
        pos = n + step
        a = time.perf_counter()
        hidden = model(torch.tensor([token]), torch.tensor([pos]), cache.attention([0], [pos], [1]))
        b = time.perf_counter()
        logits = model.compute_logits(hidden[-1:])[0]
        c = time.perf_counter()
        token = sample(logits, params)
        d = time.perf_counter()
        spent["layers"] += b - a
        spent["lm_head"] += c - b
        spent["sampling"] += d - c
    total = time.perf_counter() - start
    spent["loop"] = total - sum(spent.values())
    return {k: 1e3 * v / tokens for k, v in spent.items()} | {"step": 1e3 * total / tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--formats", default="auto,int8_all,q4_1,q4_1-plain")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models, tokenizer = {}, None
    for name in args.formats.split(","):
        weights = name.removesuffix("-plain")
        if weights not in {w.removesuffix("-plain") for w in models}:
            model, tokenizer = load_model(device="cpu", weights=weights)
        else:
            model = next(m for w, m in models.items() if w.removesuffix("-plain") == weights)
        models[name] = model
    prompt_ids = encode_prompt(tokenizer, PROMPT, chat=True)
    samples = {name: [] for name in models}
    loads = []
    for _ in range(args.rounds):
        loads.append(round(os.getloadavg()[0], 2))
        for name, model in models.items():
            model.cpu_block_layers = False if name.endswith("-plain") else None
            samples[name].append(step_pieces(model, prompt_ids, args.tokens))
    print(f"{describe_cpu()}; load average before each round {loads}; ms per decode step, median of "
          f"{args.rounds} rounds of {args.tokens} tokens")
    print("| weights | " + " | ".join(PIECES) + " | step | tokens/s |\n|" + "---|" * (len(PIECES) + 3))
    medians = {}
    for name, runs in samples.items():
        medians[name] = {k: statistics.median(r[k] for r in runs) for k in (*PIECES, "step")}
        m = medians[name]
        print(f"| {name} | " + " | ".join(f"{m[k]:.2f}" for k in PIECES) + f" | {m['step']:.2f} | "
              f"{1e3 / m['step']:.1f} |")
    print(json.dumps({"machine": describe_cpu(), "threads": args.threads, "load_average": loads, "ms": medians}))


if __name__ == "__main__":
    main()
