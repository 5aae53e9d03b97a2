"""The measured roofline of this device: peak FLOP/s and bandwidth, and real prefill and decode steps under them.

Measures the peaks (the fastest matrix product at the model's dtype; the fastest of a read, a copy and a
matrix-vector product over a buffer far larger than the caches), then times whole-prompt prefill steps and pure
decode steps of the engine and prints each step's counted FLOPs and bytes, its intensity, what it achieved and
which roof binds it. The peaks are measured before and after the steps; both are printed.

    .venv/bin/python benchmarks/bench_roofline.py [--device cuda] [--model llama-3-8b --dtype bfloat16]

``--model`` other than smollm2-135m builds random weights of that config (timing does not depend on the values).
"""

from __future__ import annotations

import argparse
import json

import pandas as pd
import torch

import workbench
from workbench.roofline import measure_decode_steps, measure_peaks, measure_prefill_steps, place_on_roofline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--lengths", default="16,64,256,1024", help="prefill prompt lengths")
    parser.add_argument("--batches", default="1,4,16,64", help="decode batch sizes")
    parser.add_argument("--context", type=int, default=64, help="decode prompt length")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.model == "smollm2-135m":
        model, _ = workbench.load_model(dtype=dtype, device=args.device)
    else:
        model = workbench.random_model(args.model, dtype=dtype, device=args.device)
    before = measure_peaks(args.device, dtype)
    prefill = measure_prefill_steps(model, [int(n) for n in args.lengths.split(",")])
    decode = measure_decode_steps(model, [int(b) for b in args.batches.split(",")], [args.context])
    after = measure_peaks(args.device, dtype)
    for name, peaks in (("before", before), ("after", after)):
        probes = {**peaks.flops_by_probe, **peaks.bandwidth_by_probe}
        probes = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in probes.items())
        print(f"peaks {name} the steps: {peaks.flops_per_s / 1e9:.1f} GFLOP/s, {peaks.bytes_per_s / 1e9:.1f} GB/s, "
              f"ridge {peaks.ridge:.2f} FLOP/B  ({probes})")
    points = place_on_roofline(pd.concat([prefill, decode], ignore_index=True), before)
    print(f"{'step':>8} {'batch':>5} {'context':>7} {'ms':>9} {'GFLOP':>8} {'MB':>8} {'FLOP/B':>7} {'GFLOP/s':>8} "
          f"{'GB/s':>6} {'bound':>9} {'% roof':>6}")
    for p in points.itertuples():
        print(f"{p.kind:>8} {p.batch:>5} {p.context:>7} {p.step_s * 1e3:>9.1f} {p.flops / 1e9:>8.2f} "
              f"{p.bytes / 1e6:>8.1f} {p.intensity:>7.2f} {p.flops_per_s / 1e9:>8.1f} {p.bytes_per_s / 1e9:>6.1f} "
              f"{p.bound:>9} {p.share_of_roof * 100:>6.0f}")
    print(json.dumps({"benchmark": "roofline", "device": args.device, "model": args.model, "dtype": args.dtype,
                      "threads": torch.get_num_threads(), "peak_gflops": round(before.flops_per_s / 1e9, 1),
                      "bandwidth_gbs": round(before.bytes_per_s / 1e9, 1), "ridge": round(before.ridge, 2),
                      "peak_gflops_after": round(after.flops_per_s / 1e9, 1),
                      "bandwidth_gbs_after": round(after.bytes_per_s / 1e9, 1),
                      "steps": [{"kind": p.kind, "batch": int(p.batch), "context": int(p.context),
                                 "ms": round(p.step_s * 1e3, 2), "intensity": round(p.intensity, 2),
                                 "bound": p.bound, "share_of_roof": round(p.share_of_roof, 3)}
                                for p in points.itertuples()]}))


if __name__ == "__main__":
    main()
