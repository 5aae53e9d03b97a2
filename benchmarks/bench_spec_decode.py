"""Speculative decoding on CPU, side by side in one run: plain decoding vs prompt lookup vs the trained draft.

Greedy, fp32, the real SmolLM2-135M. Three measurements:

1. **Batch 1, input-grounded tasks** (`datasets/prompts/grounded.json`: edit, extract, reformat a given text,
   where answers copy spans of the prompt): output tokens/s of each method, one request at a time, and the
   acceptance statistics beside the formula (1 - a^(K+1)) / (1 - a).
2. **Batch 1, held-out chat prompts** (`datasets/prompts/draft_heldout.json`): the same for open-ended answers,
   where prompt lookup has little to copy and the trained draft has to predict.
3. **Batch sizes 1, 4, 16** on the grounded tasks: tokens/s of each method relative to plain decoding at the
   same batch size. Verification costs K+1 positions per sequence; at batch 1 the step is bound by reading the
   weights, so the extra positions are nearly free, but a batch already amortises the weights and the extra
   positions cost real compute, so the gain shrinks as the batch grows.

4. **Chain vs token trees at the same verification budget** (held-out chat prompts, batch 1, the trained
   draft): for K = 4, 8, 16 drafted nodes per pass (K + 1 positions per target forward), a chain of K, a static
   tree of K nodes and a dynamic tree of K nodes (`workbench.spec_experiments.tree_compare`): tokens per target pass
   measured, beside the yield the per-depth, per-rank acceptance predicts (from the run itself, and from the
   widest static tree's acceptance: a prediction made without running the layout), the draft and verify time
   per pass, r = verify / plain forward, and the decode speedup on this CPU.

Every speculative run is checked token for token against plain decoding.

    .venv/bin/python benchmarks/bench_spec_decode.py [--max-tokens 96] [--k 4] [--parts chain,trees] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import time

import pandas as pd
import torch

import workbench
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig, SpecConfig
from workbench.data import load_prompts
from workbench.engine.llm_engine import LLMEngine
from workbench.spec.draft_head import load_draft
from workbench.spec_experiments.tree_compare import compare_layouts, layouts_at_budget

METHODS = ("plain", "ngram", "draft")


def make_engine(model, tokenizer, draft, method: str, k: int, max_num_seqs: int) -> LLMEngine:
    spec = None if method == "plain" else SpecConfig(method=method, num_speculative_tokens=k)
    return LLMEngine(model, tokenizer, spec_config=spec, draft_model=draft if method == "draft" else None,
                     scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=1024))


def run(engine: LLMEngine, prompts: list[str], params: SamplingParams, batch: int) -> tuple[list[list[int]], float]:
    """Token ids per prompt and wall seconds, feeding ``batch`` prompts to the engine at a time."""
    outputs, start = [], time.perf_counter()
    for i in range(0, len(prompts), batch):
        outputs += [o.token_ids for o in engine.generate(prompts[i:i + batch], params, progress=False)]
    return outputs, time.perf_counter() - start


def compare(model, tokenizer, draft, prompts: list[str], params: SamplingParams, k: int, batch: int,
            methods=METHODS) -> pd.DataFrame:
    rows, baseline = [], None
    for method in methods:
        engine = make_engine(model, tokenizer, draft, method, k, max(batch, 1))
        run(engine, prompts[:1], SamplingParams(max_tokens=8), 1)  # warm-up (allocations, oneDNN)
        engine.metrics.reset()
        tokens, seconds = run(engine, prompts, params, batch)
        if baseline is None:
            baseline = tokens
        elif tokens != baseline:
            raise AssertionError(f"{method} changed the greedy output at batch {batch}")
        n = sum(map(len, tokens))
        stats = engine.metrics.spec_counters().summary(k) if method != "plain" else {}
        rows.append({"method": method, "batch": batch, "output_tokens": n, "seconds": round(seconds, 2),
                     "tokens_per_s": n / seconds, **{key: stats.get(key, float("nan")) for key in (
                         "acceptance_rate", "alpha", "mean_accepted_length", "tokens_per_pass_measured",
                         "tokens_per_pass_theory")}})
    frame = pd.DataFrame(rows)
    frame["speedup"] = frame["tokens_per_s"] / frame.loc[frame["method"] == "plain", "tokens_per_s"].iloc[0]
    return frame


def trees(model, tokenizer, draft, prompts: list[str], budgets: list[int], max_tokens: int) -> dict:
    """Part 4: chain vs static and dynamic trees at each budget; prints the table, returns the JSON part."""
    def make_engine(spec: SpecConfig | None) -> LLMEngine:
        return LLMEngine(model, tokenizer, spec_config=spec, draft_model=draft if spec is not None else None,
                         cache_config=CacheConfig(memory_budget_bytes=256 * 2**20),
                         scheduler_config=SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=2048))

    layouts = [layout for k in budgets for layout in layouts_at_budget(k)]
    frame = compare_layouts(make_engine, prompts, layouts, max_tokens=max_tokens)
    print(f"\n== chain vs token trees at equal verification budgets (held-out chat, {len(prompts)} prompts x "
          f"{max_tokens} tokens, batch 1; expected_from_probe uses {frame.attrs['probe']}'s acceptance)")
    print(frame.round(3).to_string(index=False))
    cols = ["positions", "tokens_per_pass", "expected_tokens", "expected_from_probe", "draft_ms", "verify_ms", "r",
            "speedup"]
    return {row["layout"]: {c: round(float(row[c]), 3) for c in cols} for _, row in frame.iterrows()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--chat-prompts", type=int, default=8, help="held-out chat prompts used in parts 2 and 4")
    parser.add_argument("--parts", default="chain,trees",
                        help="chain: parts 1-3 (plain, prompt lookup, draft); trees: part 4 (chain vs trees)")
    parser.add_argument("--budgets", default="4,8,16", help="part 4: drafted nodes per pass")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the model runs in float32 either way: "
                                                        "speculative greedy runs are checked token for token)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    parts = set(args.parts.split(","))
    model, tokenizer = workbench.load_model(device=args.device)
    draft = load_draft(model)
    params = SamplingParams(max_tokens=args.max_tokens)
    grounded = load_prompts("grounded")
    chat = load_prompts("draft_heldout")[:args.chat_prompts]
    pd.set_option("display.width", 200)
    if "chain" not in parts:
        tree_part = trees(model, tokenizer, draft, chat, [int(k) for k in args.budgets.split(",")], args.max_tokens)
        print(json.dumps({"trees": tree_part}))
        return

    print(f"== batch 1, input-grounded tasks ({len(grounded)} prompts, {args.max_tokens} tokens, K={args.k})")
    part1 = compare(model, tokenizer, draft, grounded, params, args.k, batch=1)
    print(part1.round(3).to_string(index=False))
    print(f"\n== batch 1, held-out chat prompts ({len(chat)})")
    part2 = compare(model, tokenizer, draft, chat, params, args.k, batch=1)
    print(part2.round(3).to_string(index=False))

    print("\n== speedup against batch size (grounded tasks, 16 prompts: each task twice)")
    sixteen = (grounded * 2)[:16]
    part3 = pd.concat([compare(model, tokenizer, draft, sixteen, params, args.k, batch=b) for b in (1, 4, 16)])
    print(part3.round(3).to_string(index=False))
    pivot = part3.pivot(index="batch", columns="method", values="speedup")
    print(pivot.round(2).to_string())

    tree_part = {}
    if "trees" in parts:
        tree_part = trees(model, tokenizer, draft, chat, [int(k) for k in args.budgets.split(",")], args.max_tokens)
    speed = lambda frame, m: round(float(frame.loc[frame["method"] == m, "speedup"].iloc[0]), 3)  # noqa: E731
    print(json.dumps({
        "grounded_batch1_speedup": {m: speed(part1, m) for m in METHODS},
        "chat_batch1_speedup": {m: speed(part2, m) for m in METHODS},
        "draft_acceptance_chat": round(float(part2.loc[part2["method"] == "draft", "acceptance_rate"].iloc[0]), 3),
        "draft_alpha_chat": round(float(part2.loc[part2["method"] == "draft", "alpha"].iloc[0]), 3),
        "speedup_by_batch": {int(b): {m: round(float(v), 3) for m, v in row.items()} for b, row in pivot.iterrows()},
        "trees": tree_part,
    }))


if __name__ == "__main__":
    main()
