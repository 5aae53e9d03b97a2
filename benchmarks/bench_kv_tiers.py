"""Restore against recompute, and sessions with and without a second KV tier, side by side in one run.

Each repeat measures, on the real model: every tier's restore cost and the prefill (`workbench.roofline.tier_costs`:
the crossover by prefix length, the speedup at 512 tokens), then the same multi-turn sessions without a tier, with
the host tier and with the disk tier (`workbench.bench.sessions`: the median TTFT of returning turns). The machine's
load average is recorded before and after each repeat: on a shared 2-core machine it moves the numbers more than
anything measured here, so the table keeps every repeat and the JSON line their spread.

    .venv/bin/python benchmarks/bench_kv_tiers.py [--repeats 3] [--sessions 4]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import pandas as pd
import torch

import workbench
from workbench.bench.sessions import ARMS, multi_turn
from workbench.roofline.tier_costs import TIERS, measure_tiers
from workbench.timing import describe_machine


def one_repeat(model, repeat: int, sessions: int) -> dict:
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    costs = measure_tiers(model)
    run = multi_turn(model, sessions=sessions, arms=ARMS, repeats=1, seed=repeat)
    row = {"repeat": repeat, "load_before": load_before, "load_after": os.getloadavg()[0],
           "seconds": time.perf_counter() - start, "recompute_ms_per_token": costs.per_token_s * 1e3,
           "outputs_identical": run.outputs_identical, "device_blocks": run.device_blocks}
    for tier in TIERS:
        row[f"{tier} GB/s"] = costs.restore[tier].bytes_per_s / 1e9
        row[f"{tier} crossover tokens"] = costs.crossover_tokens(tier)
        row[f"{tier} speedup at 512"] = costs.speedup(tier, 512)
    for arm in ARMS:
        row[f"{arm} returning TTFT ms"] = float(run.returns(arm).median())
    for arm in ARMS[1:]:
        row[f"{arm} TTFT ratio"] = run.ratio(arm)
    return row


def spread(frame: pd.DataFrame) -> dict:
    numeric = frame.select_dtypes("number").drop(columns=["repeat"])
    return {c: {"median": float(np.median(numeric[c])), "min": float(numeric[c].min()), "max": float(numeric[c].max())}
            for c in numeric}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=4)
    args = parser.parse_args()
    model, _ = workbench.load_model("smollm2-135m", dtype=torch.float32, device="cpu")
    rows = []
    for repeat in range(args.repeats):
        rows.append(one_repeat(model, repeat, args.sessions))
        print(f"repeat {repeat}: load {rows[-1]['load_before']:.1f} -> {rows[-1]['load_after']:.1f}, "
              f"{rows[-1]['seconds']:.0f} s", flush=True)
    frame = pd.DataFrame(rows)
    with pd.option_context("display.width", 250, "display.max_columns", 50):
        print(frame.round(3).T.to_string())
    command = "benchmarks/bench_kv_tiers.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items())
    print(json.dumps({"machine": describe_machine("cpu"), "date": time.strftime("%Y-%m-%d"), "command": command,
                      "repeats": json.loads(frame.to_json(orient="records")), "spread": spread(frame)}))


if __name__ == "__main__":
    main()
