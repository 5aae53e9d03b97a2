"""What a second busy process does to the engine's decode at 1 and 2 torch threads (the lab's thread choice,
`workbench.lab.kit.threads`, and its busy-machine signal, `workbench.lab.kit.contention`).

Each configuration runs in a fresh Python process (thread count and OpenMP settings apply from the start): load
the real model, one uncounted warm-up, then ``--repeats`` greedy generations of ``--tokens`` tokens from one
prompt (batch 1, fp32, CPU, KV cache), each timed with the kernel's books open (schedstat: how long this
process's threads waited for a CPU). Busy processes are ``python -c "while True: pass"``, unpinned, started
before the child and killed after it. The machine's load average and CPU pressure are recorded beside each row,
because on a shared machine the "quiet" rows are only as quiet as the neighbours.

    .venv/bin/python benchmarks/bench_contention.py [--threads 1,2] [--busy 0,1] [--tokens 32] [--repeats 5]
        [--wait-policy default,passive] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SPIN = "while True: pass"


def machine_load() -> str:
    load = os.getloadavg()[0]
    pressure = Path("/proc/pressure/cpu")
    some = ""
    if pressure.is_file():
        first = pressure.read_text().split("\n")[0]  # some avg10=.. avg60=..
        some = " " + first.split()[1].replace("avg10=", "CPU pressure avg10 ") + "%"
    return f"load {load:.1f}{some}"


def worker(threads: int, tokens: int, repeats: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    import workbench
    from workbench.config import SamplingParams
    from workbench.generation import generate
    from workbench.schedstat import read_books, wait_share

    model, tokenizer = workbench.load_model(device="cpu")
    prompt = "Count from one to fifty, one number per line."
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    generate(model, tokenizer, prompt, SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    rates, waits = [], []
    for _ in range(repeats):
        before = read_books()
        result = generate(model, tokenizer, prompt, params)
        rates.append(result.decode_tokens_per_s)
        waits.append(wait_share(before, read_books()))
    return {"threads": torch.get_num_threads(), "decode_tokens_per_s": rates, "wait_share": waits}


def run_config(threads: int, busy: int, policy: str, tokens: int, repeats: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy.upper()
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    try:
        time.sleep(0.5 if busy else 0.0)
        load = machine_load()
        done = subprocess.run([sys.executable, __file__, "--worker", "--threads", str(threads), "--tokens",
                               str(tokens), "--repeats", str(repeats)], env=env, capture_output=True, text=True,
                              check=True)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    row = json.loads(done.stdout.strip().splitlines()[-1])
    rates = row["decode_tokens_per_s"]
    waits = [w for w in row["wait_share"] if w is not None]
    return {"threads": threads, "busy_processes": busy, "omp_wait_policy": policy, "load_before": load,
            "median_tok_s": statistics.median(rates), "min_tok_s": min(rates), "max_tok_s": max(rates),
            "median_wait_share": statistics.median(waits) if waits else None, "runs": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--busy", default="0,1")
    parser.add_argument("--wait-policy", default="default")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(int(args.threads), args.tokens, args.repeats)))
        return
    rows = []
    print("| threads | OMP wait policy | busy processes | decode tok/s median (min-max) | waited for a CPU | machine |")
    print("| --- | --- | --- | --- | --- | --- |")
    for busy in (int(b) for b in args.busy.split(",")):
        for policy in args.wait_policy.split(","):
            for threads in (int(t) for t in args.threads.split(",")):
                row = run_config(threads, busy, policy, args.tokens, args.repeats)
                rows.append(row)
                wait = "n/a" if row["median_wait_share"] is None else f"{row['median_wait_share']:.0%}"
                print(f"| {threads} | {policy} | {busy} | {row['median_tok_s']:.1f} ({row['min_tok_s']:.1f}-"
                      f"{row['max_tok_s']:.1f}) | {wait} | {row['load_before']} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
