"""``workbench bench``: the load generator on the command line.

    workbench bench --base-url http://gpu-box:8000 --workload mixed_short_long --request-rate 4 \\
        --slo ttft=500,tpot=50 --output rows.csv
    workbench bench --start-server --concurrency 8          # starts `workbench serve` itself, then stops it

Prints the summary (counts, throughput, goodput, TTFT/TPOT/ITL/e2e mean, median and ``--percentiles``) and ends
with one JSON line holding the whole summary, as the benchmarks in ``benchmarks/`` do; ``--result-format vllm``
writes that line in ``vllm bench serve``'s keys instead (``workbench.bench.vllm_format``). Only argparse is imported
at module level, so ``workbench --help`` works without the HTTP packages.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from workbench.bench.payloads import ENDPOINTS


def _token_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    try:
        values = (int(low), int(high if sep else low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW:HIGH token counts, got {text!r}") from None
    if not 1 <= values[0] <= values[1]:
        raise argparse.ArgumentTypeError(f"need 1 <= LOW <= HIGH, got {text!r}")
    return values


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    target.add_argument("--base-url", default=None, help="server root, e.g. http://127.0.0.1:8000")
    target.add_argument("--start-server", action="store_true", help="start `workbench serve` here for this run")
    target.add_argument("--server-args", default="",
                        help="options for the started server, e.g. --server-args='--num-blocks 512'")
    target.add_argument("--model", default=None, help="model name to request (default: the server's first)")
    target.add_argument("--api-key", default=None)
    target.add_argument("--endpoint", choices=ENDPOINTS, default="auto",
                        help="auto: chat for text prompts, completions for token ids")
    load = parser.add_argument_group("workload and load")
    load.add_argument("--workload", default="mixed_short_long", help="a name in datasets/workloads or a .jsonl")
    load.add_argument("--random", type=int, default=None, metavar="N",
                      help="N generated requests of random token ids instead of --workload")
    load.add_argument("--input-tokens", type=_token_range, default=(16, 256), help="LOW:HIGH for --random")
    load.add_argument("--output-tokens", type=_token_range, default=(8, 128), help="LOW:HIGH for --random")
    load.add_argument("--num-requests", type=int, default=None, help="take (or cycle to) this many requests")
    load.add_argument("--request-rate", type=float, default=None, help="open loop: Poisson requests per second")
    load.add_argument("--concurrency", type=int, default=None, help="closed loop: clients in flight")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--no-stream", action="store_true", help="ask for whole responses (TTFT = e2e)")
    load.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    out = parser.add_argument_group("output")
    out.add_argument("--slo", default=None,
                     help="service-level objectives (SLOs: latency targets a request must meet to count towards "
                          "goodput), in ms, e.g. ttft=500,tpot=50")
    out.add_argument("--output", default=None, help="per-request rows to this .csv or .json")
    out.add_argument("--percentiles", default="50,90,99",
                     help="latency percentiles to report, e.g. 50,90,99,99.9 (vLLM's --metric-percentiles)")
    out.add_argument("--result-format", choices=("workbench", "vllm"), default="workbench",
                     help="the closing JSON line: this tool's summary, or vllm bench serve's result keys")
    out.add_argument("--save-detailed", action="store_true",
                     help="with --result-format vllm: also the per-request lists (input_lens, output_lens, "
                          "start_times, ttfts, itls, generated_texts, errors), as vLLM's --save-detailed")
    out.add_argument("--label", default=None, help="with --result-format vllm: the result's label (vLLM's --label)")
    out.add_argument("--no-progress", action="store_true")


def _workload(args: argparse.Namespace):
    from workbench.bench.runner import repeat_to
    from workbench.workloads import load_workload, mixed_lengths

    if args.random is not None:
        if args.random < 1:
            raise ValueError(f"--random must be >= 1, got {args.random}")
        workload = mixed_lengths(args.random, prompt_tokens=args.input_tokens, output_tokens=args.output_tokens,
                                 seed=args.seed)
    else:
        workload = load_workload(args.workload)
    return repeat_to(workload, args.num_requests) if args.num_requests is not None else workload


def bench_from_args(args: argparse.Namespace) -> None:
    from workbench.bench.runner import run_benchmark
    from workbench.bench.vllm_format import parse_percentiles

    if (args.base_url is None) == (not args.start_server):
        raise ValueError("give exactly one of --base-url URL and --start-server")
    workload = _workload(args)
    percentiles = parse_percentiles(args.percentiles)
    options = dict(percentiles=percentiles, request_rate=args.request_rate, concurrency=args.concurrency,
                   seed=args.seed, model=args.model, api_key=args.api_key, slo=args.slo, endpoint=args.endpoint,
                   stream=not args.no_stream, progress=not args.no_progress, timeout_s=args.timeout)
    if args.start_server:
        from workbench.serve.launch import ServerProcess

        server_args = shlex.split(args.server_args)
        if args.model:
            server_args = ["--model", args.model, *server_args]
        if args.api_key:
            server_args += ["--api-key", args.api_key]
        print("starting workbench serve ...", file=sys.stderr, flush=True)
        with ServerProcess(server_args) as server:
            result = _measured(run_benchmark, server.url, workload, options)
    else:
        result = _measured(run_benchmark, args.base_url, workload, options)
    result.config["label"] = args.label
    _report(result, args.output, args.result_format, args.save_detailed)


def _measured(run_benchmark, url: str, workload, options: dict):
    """The run, and what it did to the server's prefix cache and second KV tier (from /metrics, when exported)."""
    from workbench.bench.server_counters import offload_delta, scrape

    before = scrape(url, options.get("api_key"))
    result = run_benchmark(url, workload, **options)
    result.config["kv_offload"] = offload_delta(before, scrape(url, options.get("api_key")))
    return result


def _report(result, output: str | None, result_format: str = "workbench", detailed: bool = False) -> None:
    s = result.summary
    print(f"target      {result.config['base_url']} ({result.config['model']}), {result.config['load']}")
    print(f"requests    {s['completed']} completed, {s['failed']} failed in {s['duration_s']:.2f} s")
    print(f"throughput  {s['request_throughput']:.2f} req/s, {s['output_throughput']:.1f} output tok/s, "
          f"{s['total_token_throughput']:.1f} total tok/s")
    if "goodput" in s:
        print(f"goodput     {s['goodput']:.2f} req/s ({s['good_requests']} of {s['completed']} within "
              f"{result.config['slo_ms']} ms)")
    if result.config.get("kv_offload"):
        from workbench.bench.server_counters import offload_line

        print(offload_line(result.config["kv_offload"]))
    print(result.table().round(1).to_string())
    if s["failed"]:
        errors = result.requests.loc[~result.requests["success"].astype(bool), "error"].value_counts()
        print("errors:\n" + errors.head(5).to_string(), file=sys.stderr)
    if output:
        print(f"rows        {result.save(output)}")
    if result_format == "vllm":
        from workbench.bench.vllm_format import vllm_result

        print(json.dumps(_finite(vllm_result(result, tuple(result.config["percentiles"]), detailed))))
    else:
        print(json.dumps({"config": result.config, "summary": _finite(s)}))


def _finite(summary: dict) -> dict:
    """NaN (a statistic with no samples) as null, so the JSON line is strict JSON."""
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in summary.items()}
