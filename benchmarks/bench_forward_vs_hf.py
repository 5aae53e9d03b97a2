"""Own forward pass vs transformers `generate`: batch-1 greedy generation on the same prompts, fp32 CPU.

Both run the real SmolLM2-135M-Instruct weights, in one process, alternating prompt by prompt so that machine
noise hits both alike. Prints a table, then one JSON line with the totals and the ratio.

    .venv/bin/python benchmarks/bench_forward_vs_hf.py [--max-tokens 64] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

import workbench
from workbench.config import SamplingParams
from workbench.data import load_prompts
from workbench.generation import generate
from workbench.prompts import encode_prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    model, tokenizer = workbench.load_model(device="cpu")
    reference = workbench.load_reference_model(device="cpu")
    prompts = [encode_prompt(tokenizer, p) for p in load_prompts("varied")]
    params = SamplingParams(max_tokens=args.max_tokens)

    def run_ours(ids):
        return len(generate(model, tokenizer, ids, params).token_ids)

    def run_hf(ids):
        with torch.inference_mode():
            out = reference.generate(torch.tensor([ids]), max_new_tokens=args.max_tokens, do_sample=False,
                                     pad_token_id=tokenizer.eos_token_id)
        return out.shape[1] - len(ids)

    run_ours(prompts[0]), run_hf(prompts[0])  # warm-up: first calls allocate and pick kernels
    rows, totals = [], {"ours": [0, 0.0], "transformers": [0, 0.0]}
    for i, ids in enumerate(prompts):
        for _ in range(args.repeats):
            for name, fn in (("ours", run_ours), ("transformers", run_hf)):
                start = time.perf_counter()
                n = fn(ids)
                elapsed = time.perf_counter() - start
                totals[name][0] += n
                totals[name][1] += elapsed
                rows.append((i, len(ids), name, n, elapsed))

    print(f"{'prompt':>6} {'prompt tok':>10} {'engine':>13} {'new tok':>8} {'seconds':>8} {'tok/s':>7}")
    for i, plen, name, n, sec in rows:
        print(f"{i:>6} {plen:>10} {name:>13} {n:>8} {sec:>8.2f} {n / sec:>7.1f}")
    ours = totals["ours"][0] / totals["ours"][1]
    hf = totals["transformers"][0] / totals["transformers"][1]
    print(f"overall tokens/s: ours {ours:.1f}, transformers {hf:.1f}, ratio {ours / hf:.2f}x")
    print(json.dumps({
        "benchmark": "forward_vs_transformers_generate", "device": "cpu", "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(), "dtype": "float32", "batch": 1,
        "max_tokens": args.max_tokens, "prompts": len(prompts), "tokens_per_s_ours": round(ours, 2),
        "tokens_per_s_transformers": round(hf, 2), "ratio": round(ours / hf, 3),
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
    }))


if __name__ == "__main__":
    main()
