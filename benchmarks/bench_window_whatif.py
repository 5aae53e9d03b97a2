"""The what-if of chapter 2: SmolLM2-135M with a sliding window imposed on five layers of every six (Gemma 3's
pattern), its quality cost and the memory it saves, side by side in one run on the same weights.

Quality: exact recall of a number hidden at a distance (`workbench.quality.recall`, answered by the engine, whose
KV groups free what leaves each window) and perplexity of ``datasets/eval/heldout.txt`` (all positions, and the
positions past the window, beside full attention's on the same positions). Memory: KV bytes per sequence at the
longest context, and the peak KV bytes the engine held during the recall run. SmolLM2 was trained with full
attention: this is the cost of imposing windows on a model that never learned them (`workbench.quality.
window_whatif`).

    .venv/bin/python benchmarks/bench_window_whatif.py [--windows 128,512] [--lengths 512,1024,2048]
        [--per-length 4] [--json out.json]

Prints a table and a final JSON line, which also names the command, the machine, the date and the versions it
ran with. Chapter 2 shows the file ``--json datasets/eval/window_whatif.json`` writes (the run takes tens of
minutes on a 2-core CPU; the notebook re-runs a smaller version live only on request).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import pandas as pd
import torch
import transformers

import workbench
from workbench.quality.window_whatif import heldout_ids, whatif_table
from workbench.timing import describe_machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", default="128,512")
    parser.add_argument("--lengths", default="512,1024,2048")
    parser.add_argument("--per-length", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    lengths = [int(n) for n in args.lengths.split(",")]
    model, tokenizer = workbench.load_model(device="cpu")
    start = time.perf_counter()
    table = whatif_table(model, tokenizer, windows, lengths=lengths, per_length=args.per_length)
    ids = heldout_ids(tokenizer)
    elapsed = time.perf_counter() - start
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.T.to_string(float_format=lambda v: f"{v:,.3f}"))
    print(f"\n{len(ids)} held-out tokens, recall at {lengths} x {args.per_length} items, {elapsed:.0f} s")
    summary = {"windows": windows, "lengths": lengths, "per_length": args.per_length, "heldout_tokens": len(ids),
               "seconds": round(elapsed, 1), "table": json.loads(table.reset_index().to_json(orient="records")),
               "command": " ".join([".venv/bin/python", "benchmarks/bench_window_whatif.py", *sys.argv[1:]]),
               "machine": describe_machine("cpu"), "date": time.strftime("%Y-%m-%d"),
               "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
