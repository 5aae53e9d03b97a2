"""Static vs dynamic vs continuous batching, side by side in one run on the same workload (fp32, CPU).

Workload: the engine-throughput benchmark's 32 requests (prompts 16-256 tokens, forced outputs 8-128 tokens
log-uniform, `workbench.workloads.mixed_lengths(32, seed=0)`), driven closed loop by
`workbench.bench.drive.drive` at two concurrencies (users each sending their next request when the last one
finishes). Every mode gets the same engine limits: ``max_num_seqs`` 16, 512 batched tokens per step; dynamic
batching starts a batch at 8 waiting requests or after 50 ms. Reports output tokens/s, p50/p99 TTFT and the
continuous / static throughput ratio at each concurrency.

    .venv/bin/python benchmarks/bench_batching.py [--requests 32] [--concurrency 8 32] [--max-num-seqs 16]
"""

from __future__ import annotations

import argparse
import json

import torch

import workbench
from workbench.bench.drive import MODES, batching_engine, drive
from workbench.workloads import mixed_lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs=2, default=[8, 32])
    parser.add_argument("--max-num-seqs", type=int, default=16)
    args = parser.parse_args()
    model, tokenizer = workbench.load_model(device="cpu")
    workload = mixed_lengths(args.requests, seed=0)
    total_out = sum(r.max_tokens for r in workload)

    def engine(mode: str):
        return batching_engine(model, tokenizer, mode, max_num_seqs=args.max_num_seqs, num_blocks=1024)

    drive(engine("continuous"), workload[:2], concurrency=2)  # warm-up: first-call allocations, thread pools
    rows = []
    for users in args.concurrency:
        for mode in MODES:
            run = drive(engine(mode), workload, concurrency=users)
            if run.summary["output_tokens"] != total_out:
                raise RuntimeError(f"{mode} produced {run.summary['output_tokens']} tokens, expected {total_out}")
            rows.append({"concurrency": users, "mode": mode, "tok_s": run.summary["output_throughput"],
                         "ttft_p50_ms": run.summary["ttft_median_ms"], "ttft_p99_ms": run.summary["ttft_p99_ms"]})

    print(f"{'users':>5} {'mode':>10} {'output tok/s':>13} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12}")
    for row in rows:
        print(f"{row['concurrency']:>5} {row['mode']:>10} {row['tok_s']:>13.1f} {row['ttft_p50_ms']:>12.0f} "
              f"{row['ttft_p99_ms']:>12.0f}")
    ratios = {}
    for users in args.concurrency:
        by_mode = {r["mode"]: r for r in rows if r["concurrency"] == users}
        ratios[users] = by_mode["continuous"]["tok_s"] / by_mode["static"]["tok_s"]
        print(f"concurrency {users}: continuous / static throughput {ratios[users]:.2f}x, p99 TTFT "
              f"{by_mode['continuous']['ttft_p99_ms']:.0f} vs {by_mode['static']['ttft_p99_ms']:.0f} ms")
    print(json.dumps({
        "benchmark": "batching", "device": "cpu", "threads": torch.get_num_threads(), "requests": args.requests,
        "output_tokens": total_out, "max_num_seqs": args.max_num_seqs,
        "rows": [{k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()} for r in rows],
        "continuous_over_static": {str(k): round(v, 2) for k, v in ratios.items()}}))


if __name__ == "__main__":
    main()
