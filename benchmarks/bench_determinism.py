"""Chapter 10's numbers: how many distinct greedy completions one prompt gets among varying traffic, with the
batch-invariant mode off and on, per KV format; and what the mode costs in throughput.

    .venv/bin/python benchmarks/bench_determinism.py [--runs 200] [--max-tokens 48] [--formats auto,int8,int4]
        [--out datasets/determinism/divergence.json] [--cost-only | --no-cost]

The divergence counts depend on steps and batch shapes, not on the clock, so they repeat exactly on the same
machine and library versions; the throughput cost is a timing (run it on a quiet machine). Prints a table and a
final JSON line; ``--out`` also keeps the result (with the machine and versions) for the chapter to read.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch
import transformers

import workbench
from workbench.prompts import encode_prompt
from workbench.quality.determinism import COST_PROMPTS, PROMPT, divergence_experiment, mode_cost, summary
from workbench.timing import describe_machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-others", type=int, default=15)
    parser.add_argument("--formats", default="auto,int8,int4")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-cost", action="store_true", help="skip the throughput comparison")
    parser.add_argument("--cost-only", action="store_true", help="only the throughput comparison")
    args = parser.parse_args()
    pd.set_option("display.width", 200)
    model, tokenizer = workbench.load_model("smollm2-135m", dtype=torch.float32, device="cpu")
    ids = encode_prompt(tokenizer, PROMPT, chat=True)
    rows = []
    if not args.cost_only:
        for fmt in args.formats.split(","):
            for mode in (False, True):
                start = time.perf_counter()
                report = divergence_experiment(model, tokenizer, ids, runs=args.runs, max_tokens=args.max_tokens,
                                               max_others=args.max_others, kv_cache_dtype=fmt, batch_invariant=mode)
                rows.append({**summary(report), "seconds": round(time.perf_counter() - start, 1)})
                print(pd.DataFrame(rows[-1:]).to_string(index=False), flush=True)
        print(pd.DataFrame(rows).to_string(index=False))
    cost = None
    if not args.no_cost:
        prompts = [encode_prompt(tokenizer, p, chat=True) for p in COST_PROMPTS]
        frame = mode_cost(model, tokenizer, prompts, max_tokens=32, repeats=3)
        medians = frame.groupby("batch_invariant")["tokens_per_s"].median()
        cost = {"requests": len(prompts), "max_tokens": 32, "tokens_per_s_default": round(float(medians[False]), 1),
                "tokens_per_s_invariant": round(float(medians[True]), 1),
                "invariant_over_default": round(float(medians[True] / medians[False]), 3)}
        print(frame.to_string(index=False))
    result = {"prompt": PROMPT, "prompt_tokens": len(ids), "max_tokens": args.max_tokens,
              "max_others": args.max_others, "divergence": rows, "cost": cost,
              "machine": describe_machine("cpu"), "date": time.strftime("%Y-%m-%d"),
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.out.exists():  # keep what another invocation measured (the divergence or the cost)
            old = json.loads(args.out.read_text())
            if not rows:  # a cost-only run: the divergence's settings and machine stay, the cost says its own
                cost["machine"] = result["machine"]
                result = {**old, "cost": cost}
            result["divergence"] = rows or old.get("divergence", [])
            result["cost"] = cost or old.get("cost")
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
