"""Serving overhead: the same workload through the HTTP server and through the offline engine, in one run.

1. Throughput: the 32 requests of ``datasets/workloads/mixed_short_long.jsonl`` (token-id prompts of 16-256
   tokens, forced outputs of 8-128 tokens), all arriving at once, greedy, fp32, ``max_num_seqs`` 16.
   Offline: ``run_workload`` drives an ``LLMEngine`` in this process. HTTP: ``workbench serve`` in a child
   process with the same settings, driven by ``workbench.bench.run_benchmark`` (streaming, /v1/completions).
   Rounds alternate (offline, HTTP, offline, HTTP, ...) so that a change in machine load hits both.
   The offline engine is driven from a worker thread, as the server's engine is: with PyTorch's OpenMP
   threads spin-waiting (the default), a loaded machine made the same engine 7-8x slower when stepped from
   the main thread than from a second thread (measured 2026-11-23, load ~12 on 2 cores; with
   OMP_WAIT_POLICY=PASSIVE both ran alike), which would be a difference of threading, not of HTTP.
2. TTFT overhead at batch 1: 8 short chat questions one at a time (8 output tokens each). Offline TTFT is the
   engine's (first token - arrival); HTTP TTFT is the client's (first streamed chunk - request sent); the
   server's own engine-side TTFT comes from its Prometheus histogram, so the difference splits into HTTP +
   JSON + SSE cost and the rest.

    .venv/bin/python benchmarks/bench_serving.py [--rounds 2] [--max-num-seqs 16]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families

import workbench
from workbench.bench import run_benchmark, run_workload
from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.serve.launch import ServerProcess
from workbench.workloads import WorkloadRequest, load_workload, questions

TTFT_QUESTIONS = 8
TTFT_OUTPUT_TOKENS = 8


def server_ttft(url: str) -> tuple[float, float]:
    """(sum, count) of the server's vllm:time_to_first_token_seconds histogram."""
    values = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name.startswith("vllm:time_to_first_token_seconds_"):
                values[sample.name.rsplit("_", 1)[-1]] = sample.value
    return values["sum"], values["count"]


def offline_throughput(engine: LLMEngine, workload: list[WorkloadRequest]) -> tuple[float, float]:
    """(output tokens/s, mean TTFT s) of one offline run, all requests at once."""
    result = run_workload(engine, workload, realtime=False, progress=False, chat=False)
    return result.throughput["output_tokens_per_s"], float(result.requests["ttft_s"].mean())


def http_throughput(url: str, workload: list[WorkloadRequest]) -> tuple[float, float]:
    result = run_benchmark(url, workload, progress=False)
    assert result.summary["failed"] == 0, result.requests["error"].dropna().head()
    assert result.summary["output_tokens"] == sum(r.max_tokens for r in workload)
    return result.summary["output_throughput"], result.summary["ttft_mean_ms"] / 1e3


def ttft_batch1(engine: LLMEngine, url: str, on_offline_thread) -> dict[str, float]:
    workload = [WorkloadRequest(q, TTFT_OUTPUT_TOKENS, ignore_eos=True) for q in questions(TTFT_QUESTIONS, seed=1)]
    offline = [on_offline_thread(lambda r=r: run_workload(engine, [r], realtime=False, progress=False))
               .requests["ttft_s"].iloc[0] for r in workload]
    before = server_ttft(url)
    http = run_benchmark(url, workload, concurrency=1, progress=False)
    after = server_ttft(url)
    server_side = (after[0] - before[0]) / (after[1] - before[1])
    client = http.requests["ttft_s"]
    return {"offline_ttft_ms": 1e3 * statistics.median(offline), "http_ttft_ms": 1e3 * client.median(),
            "server_engine_ttft_mean_ms": 1e3 * server_side, "http_ttft_mean_ms": 1e3 * client.mean(),
            "offline_ttft_mean_ms": 1e3 * statistics.fmean(offline)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    args = parser.parse_args()
    workload = load_workload("mixed_short_long")
    scheduler = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=512)
    model, tokenizer = workbench.load_model(device="cpu")
    engine = LLMEngine(model, tokenizer, cache_config=CacheConfig(), scheduler_config=scheduler)
    server_args = ["--device", "cpu", "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", "512"]

    offline_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="offline-engine")

    def on_offline_thread(fn, *args):
        return offline_thread.submit(fn, *args).result()

    with ServerProcess(server_args) as server, offline_thread:
        on_offline_thread(lambda: run_workload(engine, workload[:2], realtime=False, progress=False, chat=False))
        run_benchmark(server.url, workload[:2], progress=False)  # warm-up, both sides
        offline, http = [], []
        for index in range(args.rounds):
            offline.append(on_offline_thread(offline_throughput, engine, workload))
            http.append(http_throughput(server.url, workload))
            print(f"round {index + 1}: offline {offline[-1][0]:.1f} tok/s, HTTP {http[-1][0]:.1f} tok/s",
                  file=sys.stderr, flush=True)
        ttft = ttft_batch1(engine, server.url, on_offline_thread)

    offline_tps = statistics.median(t for t, _ in offline)
    http_tps = statistics.median(t for t, _ in http)
    ratio = http_tps / offline_tps
    print(f"workload: {len(workload)} requests, {sum(r.max_tokens for r in workload)} output tokens, all at once; "
          f"max_num_seqs {args.max_num_seqs}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'path':>8} {'output tok/s per round':>28} {'median':>8} {'mean TTFT s':>12}")
    for name, runs in (("offline", offline), ("HTTP", http)):
        print(f"{name:>8} {', '.join(f'{t:.1f}' for t, _ in runs):>28} {statistics.median(t for t, _ in runs):>8.1f} "
              f"{statistics.fmean(s for _, s in runs):>12.2f}")
    print(f"HTTP / offline throughput: {ratio:.3f}x")
    overhead = ttft["http_ttft_ms"] - ttft["offline_ttft_ms"]
    print(f"batch-1 TTFT (median of {TTFT_QUESTIONS} chat questions): offline {ttft['offline_ttft_ms']:.1f} ms, "
          f"HTTP client {ttft['http_ttft_ms']:.1f} ms, overhead {overhead:.1f} ms")
    print(f"  means: offline {ttft['offline_ttft_mean_ms']:.1f} ms, server engine "
          f"{ttft['server_engine_ttft_mean_ms']:.1f} ms, HTTP client {ttft['http_ttft_mean_ms']:.1f} ms")
    print(json.dumps({"offline_output_tok_s": offline_tps, "http_output_tok_s": http_tps, "http_over_offline": ratio,
                      "rounds": [{"offline": o[0], "http": h[0]} for o, h in zip(offline, http, strict=True)],
                      "ttft_overhead_ms": overhead, **ttft}))


if __name__ == "__main__":
    main()
