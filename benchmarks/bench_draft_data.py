"""How the trained draft's acceptance grows with training data: the committed recipe on growing subsets, one run.

The draft (`workbench.draft_training`) misses the issue's α ≥ 0.5 goal, and this measures why: it trains
the same recipe (`TrainConfig()`, 3 epochs) on 25%, 50% and 100% of the target answers it is given and reports
the held-out per-token acceptance α and accepted / drafted at K = 4 for each (greedy replay,
`workbench.draft_training.evaluate`), then fits α against log2(tokens) and extends the line to α = 0.5.

The data is what `draft_training --data PATH` caches (the target's answers with its features); several files
are merged, answers that appear in more than one counted once, so two earlier runs' answers give a subset
larger than one 30-minute run makes:

    .venv/bin/python -m workbench.draft_training --seed 0 --data /tmp/a.pt --heldout-data /tmp/h.pt
    .venv/bin/python -m workbench.draft_training --seed 0 --sampled-max-tokens 256 --data /tmp/b.pt
    .venv/bin/python benchmarks/bench_draft_data.py --data /tmp/a.pt /tmp/b.pt --heldout-data /tmp/h.pt

Each subset is a seeded random choice of whole answers; smaller subsets are prefixes of larger ones. Training
the full 237 k tokens of those two runs takes ~12 minutes on 2 cores, the whole script ~25.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch

import workbench
from workbench.draft_training.data import DraftSample, add_taps
from workbench.draft_training.evaluate import acceptance_on_samples
from workbench.draft_training.train import TrainConfig, train_draft
from workbench.spec.draft_head import load_draft, save_draft


def merged_samples(paths: list[str]) -> list[DraftSample]:
    """The samples of every file, each distinct token sequence once (first occurrence kept)."""
    seen, merged = set(), []
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no cached draft data at {path}: make it with "
                                    f"`python -m workbench.draft_training --data {path}`")
        for sample in torch.load(path, weights_only=False):
            key = tuple(sample.tokens.tolist())
            if key not in seen:
                seen.add(key)
                merged.append(sample)
    return merged


def fit_per_doubling(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares line α = a + b * log2(tokens); returns (b, tokens where the line reaches 0.5)."""
    xs = [math.log2(t) for t, _ in points]
    ys = [a for _, a in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    return b, (2 ** ((0.5 - a) / b) if b > 0 else math.inf)


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", nargs="+", required=True, help="cached training data (draft_training --data)")
    p.add_argument("--heldout-data", required=True, help="cached held-out data (draft_training --heldout-data)")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    p.add_argument("--epochs", type=int, default=TrainConfig().epochs)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    if not args.fractions or any(not 0 < f <= 1 for f in args.fractions):
        raise SystemExit(f"--fractions must lie in (0, 1], got {args.fractions}")

    target, _ = workbench.load_model("smollm2-135m", dtype=torch.float32, device="cpu")
    target.prepare()
    cfg = TrainConfig(epochs=args.epochs, seed=args.seed)
    samples = add_taps(target, merged_samples(args.data), cfg.taps)
    heldout = add_taps(target, torch.load(args.heldout_data, weights_only=False), cfg.taps)
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(args.seed)).tolist()
    rows = []
    for fraction in sorted(set(args.fractions)):
        subset = [samples[i] for i in order[:max(1, round(fraction * len(samples)))]]
        tokens = sum(len(s.tokens) for s in subset)
        start = time.perf_counter()
        draft, log = train_draft(target, subset, cfg)
        train_s = time.perf_counter() - start
        with tempfile.TemporaryDirectory() as tmp:  # measure the stored (float16) weights, as the committed draft
            draft = load_draft(target, save_draft(draft, Path(tmp) / "draft.safetensors", {}))
        result = acceptance_on_samples(draft, heldout, k=4)
        rows.append({"fraction": fraction, "answers": len(subset), "tokens": tokens, "steps": log["steps"],
                     "train_s": round(train_s, 1), "alpha": round(result["alpha"], 4),
                     "accepted_per_drafted": round(result["acceptance"], 4),
                     "tokens_per_pass": round(result["tokens_per_verification"], 3)})
        print(json.dumps(rows[-1]), flush=True)
    summary: dict[str, object] = {"rows": rows, "heldout_answers": len(heldout), "k": 4, "epochs": cfg.epochs}
    if len({r["tokens"] for r in rows}) >= 2:  # a line needs two different sizes (tiny data can round alike)
        per_doubling, tokens_at_half = fit_per_doubling([(r["tokens"], r["alpha"]) for r in rows])
        summary.update(alpha_per_doubling=round(per_doubling, 4), tokens_for_alpha_0_5=round(tokens_at_half))
    print("\n| answers | tokens | steps | training s | α | accepted / drafted | tokens per pass |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['answers']} | {r['tokens']:,} | {r['steps']} | {r['train_s']:.0f} | {r['alpha']:.3f} | "
              f"{r['accepted_per_drafted']:.3f} | {r['tokens_per_pass']:.2f} |")
    if "alpha_per_doubling" in summary:
        print(f"\nα per doubling of the data: {summary['alpha_per_doubling']:+.3f}; the line reaches α = 0.5 at "
              f"~{summary['tokens_for_alpha_0_5']:,} tokens")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
