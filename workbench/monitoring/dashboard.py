"""What a serving dashboard plots, from scraped samples, and a load run watched by a scraper.

    watched = watch_load(url, steady_load(40, rate=5) + long_prompt_burst(6, 1500, at_s=5))
    panels = panel_frame(watched.samples, window_s=2)   # one row per scrape: TTFT/ITL p50/p99, queue, KV, ...

The panels are the Grafana dashboard's (datasets/grafana/kv_workbench_serving.json), computed the same way
(`workbench.monitoring.promql`) so the notebook and a Grafana over the same server agree.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from workbench.bench.runner import ServingBenchResult, run_benchmark
from workbench.monitoring import promql
from workbench.monitoring.scrape import MetricsScraper
from workbench.workloads import WorkloadRequest

PANELS = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "running", "waiting", "kv_usage",
          "prefix_hit_rate", "preemptions_per_s", "acceptance_rate", "generation_tokens_per_s")


def _panel_series(samples: pd.DataFrame, window_s: float) -> dict[str, Callable[[], pd.Series]]:
    ttft, itl = "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"
    return {
        "ttft_p50_s": lambda: promql.windowed_quantile(samples, ttft, 0.5, window_s),
        "ttft_p99_s": lambda: promql.windowed_quantile(samples, ttft, 0.99, window_s),
        "itl_p50_s": lambda: promql.windowed_quantile(samples, itl, 0.5, window_s),
        "itl_p99_s": lambda: promql.windowed_quantile(samples, itl, 0.99, window_s),
        "running": lambda: promql.gauge(samples, "vllm:num_requests_running"),
        "waiting": lambda: promql.gauge(samples, "vllm:num_requests_waiting"),
        "kv_usage": lambda: promql.gauge(samples, "vllm:kv_cache_usage_perc"),
        "prefix_hit_rate": lambda: promql.ratio_of_increases(samples, "vllm:prefix_cache_hits_total",
                                                             "vllm:prefix_cache_queries_total", window_s),
        "preemptions_per_s": lambda: promql.rate(promql.counter(samples, "vllm:num_preemptions_total"), window_s),
        "acceptance_rate": lambda: promql.ratio_of_increases(samples, "vllm:spec_decode_num_accepted_tokens_total",
                                                             "vllm:spec_decode_num_draft_tokens_total", window_s),
        "generation_tokens_per_s": lambda: promql.rate(promql.counter(samples, "vllm:generation_tokens_total"),
                                                       window_s),
    }


def panel_frame(samples: pd.DataFrame, window_s: float) -> pd.DataFrame:
    """One row per scrape time (seconds from the first scrape), one column per dashboard panel series; a series
    whose metric the server does not export (a vLLM without speculative decoding, say) is all NaN."""
    times = pd.Index(sorted(samples["time"].unique()))
    columns = {}
    for name, compute in _panel_series(samples, window_s).items():
        try:
            columns[name] = compute().reindex(times)
        except KeyError:
            columns[name] = pd.Series(float("nan"), index=times)
    frame = pd.DataFrame(columns)
    frame.index = pd.Index(times - times[0], name="t_s")
    return frame


def random_tokens(rng: random.Random, count: int, vocab: int = 49152) -> list[int]:
    # ids from 1000 up: clear of the special and byte tokens at the bottom of SmolLM2's vocabulary
    return [rng.randrange(1000, vocab) for _ in range(count)]


def steady_load(n: int, rate: float, *, prompt_tokens: int = 24, max_tokens: int = 8, start_s: float = 0.0,
                seed: int = 0) -> list[WorkloadRequest]:
    """``n`` short requests evenly spaced at ``rate`` per second (even, not Poisson: a steady baseline)."""
    if not (n >= 1 and rate > 0):
        raise ValueError(f"need n >= 1 and rate > 0, got n={n!r}, rate={rate!r}")
    rng = random.Random(seed)
    return [WorkloadRequest(random_tokens(rng, prompt_tokens), max_tokens, start_s + i / rate, ignore_eos=True,
                            tags={"kind": "steady"}) for i in range(n)]


def long_prompt_burst(n: int, prompt_tokens: int, *, at_s: float, max_tokens: int = 4,
                      seed: int = 1) -> list[WorkloadRequest]:
    """The fault: ``n`` long prompts arriving together at ``at_s``; their prefill holds up everyone's first token."""
    rng = random.Random(seed)
    return [WorkloadRequest(random_tokens(rng, prompt_tokens), max_tokens, at_s, ignore_eos=True,
                            tags={"kind": "burst"}) for _ in range(n)]


@dataclass(slots=True)
class WatchedLoad:
    samples: pd.DataFrame  # every scrape (workbench.monitoring.scrape columns)
    bench: ServingBenchResult  # what the client measured, per request
    started_at: float  # time.time() when the load started (scrape times are on the same clock)


def watch_load(url: str, workload: list[WorkloadRequest], *, interval_s: float = 0.25, tail_s: float = 0.5,
               progress: bool = False) -> WatchedLoad:
    """Scrape ``url``'s /metrics every ``interval_s`` while the benchmark client replays ``workload`` on its own
    arrival times, and for ``tail_s`` after, so the last requests' histograms are in the samples."""
    with MetricsScraper(url, interval_s=interval_s) as scraper:
        scraper.scrape_once()  # a first sample before any request: every window starts from a known zero
        started = time.time()
        bench = run_benchmark(url, sorted(workload, key=lambda r: r.arrival_s), progress=progress)
        time.sleep(tail_s)
        scraper.scrape_once()
    if scraper.errors:
        raise RuntimeError(f"scrapes failed while watching: {scraper.errors[:3]}")
    return WatchedLoad(scraper.frame(), bench, started)
