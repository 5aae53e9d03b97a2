"""What monitoring costs: the engine's profiling ranges with no profiler running, and scraping /metrics under load.

Side by side in one run, rounds interleaved (A, B, C, A, B, C, ...) so a change in the machine's load hits
every variant alike; the median round of each is reported, on the real model (SmolLM2-135M, fp32, CPU):

1. engine steps/s on one offline workload with
   * ``ranges (as shipped)``: the step's named ranges, which open nothing unless a profiler runs;
   * ``no ranges``: every range replaced by one shared ``nullcontext`` (the least a ``with`` can cost);
   * ``record_function always``: the ranges opened unconditionally (what the gate avoids);
   * ``under torch.profiler``: the whole run profiled (what ``profile_steps`` costs while it runs);
2. served output tokens/s through ``workbench serve`` (a child process), with and without a scraper in this
   process reading /metrics every 0.25 s (4x a typical 1 s Prometheus interval; the server records its metrics
   in both);
3. one range's enter + exit timed alone (``timeit``), as shipped and as an unconditional ``record_function``,
   and its share of the measured step: whole-run ratios on a shared 2-core machine move by +-10 % from load
   alone, far more than microseconds per step can, so this is the number that resolves the ranges' cost.

    .venv/bin/python benchmarks/bench_monitoring_overhead.py [--rounds 3] [--requests 12]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
import timeit

import torch
from torch.profiler import profile, record_function

import workbench
import workbench.engine.bookkeeping as bookkeeping
import workbench.engine.llm_engine as llm_engine
import workbench.engine.model_runner as model_runner
from workbench.bench import run_benchmark, run_workload
from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.monitoring.scrape import MetricsScraper
from workbench.serve.launch import ServerProcess
from workbench.workloads import mixed_lengths

ENGINE_MODULES = (llm_engine, bookkeeping, model_runner)
_NULL = contextlib.nullcontext()
RANGES_PER_STEP = 7  # schedule, draft, prepare, forward, sample, verify, postprocess: each opened once a step


@contextlib.contextmanager
def ranges_as(variant: str):
    shipped = {module: module.step_range for module in ENGINE_MODULES}
    replacement = {"no ranges": lambda name: _NULL, "record_function always": lambda name: record_function(name)}
    try:
        for module in ENGINE_MODULES:
            module.step_range = replacement.get(variant, shipped[module])
        with profile() if variant == "under torch.profiler" else contextlib.nullcontext():
            yield
    finally:
        for module, original in shipped.items():
            module.step_range = original


def engine_steps_per_s(model, tokenizer, workload, variant: str) -> float:
    engine = LLMEngine(model, tokenizer, cache_config=CacheConfig(num_blocks=512),
                       scheduler_config=SchedulerConfig(max_num_seqs=16))
    with ranges_as(variant):
        began = time.perf_counter()
        run_workload(engine, workload, realtime=False, progress=False)
        elapsed = time.perf_counter() - began
    return len(engine.metrics.step_frame()) / elapsed


def served_tokens_per_s(url: str, workload, scrape: bool) -> float:
    scraper = MetricsScraper(url, interval_s=0.25) if scrape else None
    with scraper or contextlib.nullcontext():
        result = run_benchmark(url, workload, concurrency=8, progress=False)
    if scraper is not None and not scraper.scrape_times:
        raise RuntimeError("the scraper never scraped")
    return result.summary["output_throughput"]


def range_cost_us(repeats: int = 200_000) -> dict[str, float]:
    """One range's enter + exit, in microseconds, with no profiler running: as shipped, and record_function."""
    def shipped():
        with llm_engine.step_range("forward"):
            pass

    def always():
        with record_function("engine.forward"):
            pass

    return {name: min(timeit.repeat(fn, number=repeats, repeat=3)) / repeats * 1e6
            for name, fn in (("as shipped", shipped), ("record_function", always))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=12)
    args = parser.parse_args()
    model, tokenizer = workbench.load_model(device="cpu")
    workload = mixed_lengths(args.requests, prompt_tokens=(16, 128), output_tokens=(8, 48), seed=0)
    run_workload(LLMEngine(model, tokenizer), workload[:2], realtime=False, progress=False)  # warm-up

    variants = ("ranges (as shipped)", "no ranges", "record_function always", "under torch.profiler")
    steps = {v: [] for v in variants}
    served = {"no scraper": [], "scraper every 0.25 s": []}
    for _ in range(args.rounds):
        for variant in variants:
            steps[variant].append(engine_steps_per_s(model, tokenizer, workload, variant))
    # The server in a child process, as in production: the scraper parses in this process, not the server's.
    with ServerProcess(["--num-blocks", "512", "--max-num-seqs", "16"]) as server:
        run_benchmark(server.url, workload[:2], progress=False)  # warm-up
        for _ in range(args.rounds):
            for name in served:
                served[name].append(served_tokens_per_s(server.url, workload, scrape=name != "no scraper"))

    base = statistics.median(steps["no ranges"])
    print(f"{'engine variant':<26}{'steps/s (median)':>18}{'vs no ranges':>14}   rounds")
    for variant, values in steps.items():
        print(f"{variant:<26}{statistics.median(values):>18.2f}{statistics.median(values) / base:>14.3f}   "
              + " ".join(f"{v:.2f}" for v in values))
    plain = statistics.median(served["no scraper"])
    print(f"\n{'server':<26}{'output tok/s':>18}{'vs no scraper':>14}   rounds")
    for name, values in served.items():
        print(f"{name:<26}{statistics.median(values):>18.1f}{statistics.median(values) / plain:>14.3f}   "
              + " ".join(f"{v:.1f}" for v in values))
    costs = range_cost_us()
    step_us = 1e6 / statistics.median(steps["ranges (as shipped)"])
    print(f"\none range, no profiler: {costs['as shipped']:.2f} us as shipped, {costs['record_function']:.2f} us as "
          f"record_function; x{RANGES_PER_STEP} per step of {step_us / 1000:.1f} ms = "
          f"{costs['as shipped'] * RANGES_PER_STEP / step_us:.5%} of the step as shipped")
    summary = {f"steps_ratio[{v}]": round(statistics.median(steps[v]) / base, 4) for v in variants}
    summary["served_ratio[scraper]"] = round(statistics.median(served["scraper every 0.25 s"]) / plain, 4)
    summary.update({f"range_us[{k}]": round(v, 3) for k, v in costs.items()})
    summary["ranges_share_of_step"] = costs["as shipped"] * RANGES_PER_STEP / step_us
    summary.update(rounds=args.rounds, requests=args.requests, threads=torch.get_num_threads())
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
