"""Chapter 7's numbers for benchmarks/RESULTS.md: the notebook's measurements, larger, printed as tables and
a final JSON line.

    .venv/bin/python benchmarks/bench_spec_chapter.py [--prompts 4] [--max-tokens 64]

The same helpers as the notebook (`workbench.spec_experiments`: methods, compare, forward_cost,
sampling_check), with more prompts and longer answers, so the ratios rest on more tokens. Plotting is not
needed and not imported.
"""

from __future__ import annotations

import argparse
import json

import pandas as pd
import torch

import workbench
from workbench.spec.draft_head import load_draft
from workbench.spec.theory import best_k, break_even_alpha, speedup
from workbench.spec_experiments.compare import compare
from workbench.spec_experiments.forward_cost import forward_curve
from workbench.spec_experiments.methods import PROPOSERS, task_prompts
from workbench.spec_experiments.sampling_check import sampling_check

COLUMNS = ["decode_tokens_per_s", "speedup", "alpha", "accepted_per_drafted", "tokens_per_pass",
           "tokens_per_pass_theory", "draft_cost_c", "verify_cost_r", "speedup_model", "speedup_textbook",
           "same_as_plain"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    pd.set_option("display.width", 220)
    model, tokenizer = workbench.load_model("smollm2-135m", dtype=torch.float32, device="cpu")
    draft = load_draft(model)
    curve = forward_curve(model)
    print(curve.frame.round(2).to_string(index=False))
    result: dict[str, object] = {"r_batch1_k4": round(curve.ratio(5), 3), "r_batch16_k4": round(curve.ratio(80, 16), 3)}

    for task in ("grounded", "open chat"):
        cmp = compare(model, tokenizer, task_prompts(task, args.prompts), [(p, args.k) for p in PROPOSERS],
                      max_tokens=args.max_tokens, draft=draft)
        summary = cmp.summary()
        print(f"\n== {task}, batch 1, K={args.k}, {args.prompts} prompts x {args.max_tokens} tokens\n"
              + summary[COLUMNS].round(3).to_string())
        result[task] = {label: {key: round(float(summary.loc[label, key]), 3) for key in
                                ("speedup", "alpha", "draft_cost_c", "verify_cost_r", "speedup_model")}
                        for label in PROPOSERS}
        for label in PROPOSERS:
            row = summary.loc[label]
            result[task][label]["break_even_alpha"] = round(break_even_alpha(args.k, row["draft_cost_c"],
                                                                             row["verify_cost_r"]), 3)

    sweep = compare(model, tokenizer, task_prompts("grounded", args.prompts),
                    [("prompt lookup", k) for k in (1, 2, 4, 8)], max_tokens=args.max_tokens, draft=draft)
    table = sweep.summary().iloc[1:]
    print("\n== K sweep, prompt lookup, grounded\n" + table[["K", *COLUMNS]].round(3).to_string())
    alpha, c = sweep.pooled(list(table.index))
    result["k_sweep"] = {"measured": {int(k): round(float(s), 3) for k, s in zip(table["K"], table["speedup"],
                                                                                   strict=True)},
                         "model_best_k": best_k(alpha, c, verify_cost=curve.verify_cost(1))[0],
                         "model": {k: round(speedup(alpha, k, c, curve.verify_cost(1)), 3) for k in (1, 2, 4, 8)}}

    by_batch = {}
    for b in (1, 4, 16):
        cmp = compare(model, tokenizer, task_prompts("grounded", b), [(p, args.k) for p in PROPOSERS],
                      max_tokens=32, batch=b, draft=draft)
        summary = cmp.summary()
        by_batch[b] = {label: round(float(summary.loc[label, "speedup"]), 3) for label in PROPOSERS}
        by_batch[b]["plain_tokens_per_s"] = round(float(summary.loc["plain", "decode_tokens_per_s"]), 1)
        by_batch[b]["same_as_plain"] = bool(summary["same_as_plain"].dropna().all())
    print("\n== batch sizes (grounded, 32 tokens)\n" + pd.DataFrame(by_batch).T.to_string())
    result["by_batch"] = by_batch

    check = sampling_check("draft model", samples=4000)
    result["sampling_p_value"] = round(check.p_value, 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
