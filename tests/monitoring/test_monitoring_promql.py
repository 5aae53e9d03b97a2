"""The metrics client's PromQL: parsing literal exposition text, counter resets, rates, histogram quantiles
against numbers worked by hand and against numpy on the raw samples, windowed ratios; and the scraper against
a real HTTP endpoint on 127.0.0.1."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, start_http_server

from workbench.monitoring.promql import (
    counter,
    histogram_quantile,
    increase,
    rate,
    ratio_of_increases,
    windowed_quantile,
)
from workbench.monitoring.scrape import MetricsScraper, parse_exposition, samples_frame
from workbench.serve.metrics import TTFT_BUCKETS


def exposition(requests: float, hits: float, queries: float, buckets: dict[str, float]) -> str:
    lines = ["# TYPE vllm:request_success counter",
             f'vllm:request_success_total{{model_name="m",finished_reason="stop"}} {requests}',
             "# TYPE vllm:prefix_cache_hits counter", f'vllm:prefix_cache_hits_total{{model_name="m"}} {hits}',
             "# TYPE vllm:prefix_cache_queries counter",
             f'vllm:prefix_cache_queries_total{{model_name="m"}} {queries}',
             "# TYPE vllm:time_to_first_token_seconds histogram"]
    lines += [f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {count}'
              for le, count in buckets.items()]
    lines += [f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {buckets["+Inf"]}',
              'vllm:time_to_first_token_seconds_sum{model_name="m"} 1.0']
    return "\n".join(lines) + "\n"


def test_histogram_quantile_by_hand():
    buckets = [(0.1, 10), (0.5, 30), (1.0, 40), (math.inf, 40)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.3)  # rank 20: halfway through (0.1, 0.5]
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.98)  # rank 39.6: 9.6 of 10 into (0.5, 1]
    assert histogram_quantile(0.1, buckets) == pytest.approx(0.04)  # rank 4 in the first bucket, from 0
    assert histogram_quantile(0.9, [(0.1, 10), (math.inf, 20)]) == 0.1  # rank in +Inf: the top finite bound
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0), (math.inf, 0)]))
    assert math.isnan(histogram_quantile(0.5, [(0.1, 5), (1.0, 5)]))  # no +Inf bucket
    assert histogram_quantile(1.5, buckets) == math.inf and histogram_quantile(-1, buckets) == -math.inf


def test_counter_reset_and_rate_by_hand():
    # success: 10, 20, then a restart (5), then 15 -> reset-adjusted 10, 20, 25, 35
    texts = [exposition(v, 0, 0, {"0.1": 0, "+Inf": 0}) for v in (10, 20, 5, 15)]
    frame = samples_frame([row for t, text in enumerate(texts) for row in parse_exposition(text, float(t))])
    total = counter(frame, "vllm:request_success_total", finished_reason="stop")
    assert total.tolist() == [10, 20, 25, 35]
    assert increase(total, 2.0).tolist()[1:] == [10, 15, 15] and math.isnan(increase(total, 2.0).iloc[0])
    assert rate(total, 2.0).iloc[-1] == pytest.approx(7.5)  # (35 - 20) / (3 - 1)
    with pytest.raises(ValueError, match="window"):
        rate(total, 0)
    with pytest.raises(KeyError):
        counter(frame, "vllm:nothing_total")


def test_windowed_quantile_and_hit_rate_by_hand():
    first = exposition(0, 0, 0, {"0.1": 100, "0.5": 100, "1.0": 100, "+Inf": 100})  # old fast requests
    second = exposition(0, 30, 100, {"0.1": 110, "0.5": 130, "1.0": 140, "+Inf": 140})
    third = exposition(0, 130, 200, {"0.1": 110, "0.5": 130, "1.0": 140, "+Inf": 140})
    frame = samples_frame(parse_exposition(first, 0.0) + parse_exposition(second, 10.0) + parse_exposition(third, 20.0))
    p50 = windowed_quantile(frame, "vllm:time_to_first_token_seconds", 0.5, window_s=10)
    # window ending at 10 s: the 40 new requests only (10 / 20 / 10), so the median is 0.3, not 0.1
    assert math.isnan(p50.iloc[0]) and p50.iloc[1] == pytest.approx(0.3)
    assert math.isnan(p50.iloc[2])  # nothing observed in (10, 20]
    hit = ratio_of_increases(frame, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", 10)
    assert hit.iloc[1:].tolist() == pytest.approx([0.3, 1.0])


def test_quantile_matches_numpy_within_bucket_resolution():
    rng = np.random.default_rng(0)
    registry = CollectorRegistry()
    ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", registry=registry, buckets=TTFT_BUCKETS)
    for value in rng.exponential(5.0, 500):  # before the window: must not count
        ttft.observe(value)
    rows = parse_exposition(generate_latest(registry).decode(), 0.0)
    samples = rng.lognormal(mean=np.log(0.2), sigma=0.8, size=5000)
    for value in samples:
        ttft.observe(value)
    frame = samples_frame(rows + parse_exposition(generate_latest(registry).decode(), 30.0))
    bounds = np.array((0.0, *TTFT_BUCKETS))
    for q in (0.5, 0.9, 0.99):
        estimate = windowed_quantile(frame, "vllm:time_to_first_token_seconds", q, window_s=30).iloc[-1]
        exact = float(np.quantile(samples, q))
        bucket = np.searchsorted(bounds, exact)  # (bounds[bucket - 1], bounds[bucket]] holds the exact value
        assert bounds[bucket - 1] <= estimate <= bounds[bucket], (q, exact, estimate)


def test_scraper_reads_a_live_endpoint():
    registry = CollectorRegistry()
    requests = Counter("vllm:request_success", "requests", registry=registry)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        with MetricsScraper(url, interval_s=0.05) as scraper:
            for _ in range(5):
                requests.inc(2)
                time.sleep(0.06)
            deadline = time.monotonic() + 5
            while len(scraper.scrape_times) < 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            scraper.scrape_once()  # one scrape surely after the last increment
        frame = scraper.frame()
        assert scraper.errors == [] and len(scraper.scrape_times) >= 4
        total = counter(frame, "vllm:request_success_total")
        assert total.is_monotonic_increasing and total.iloc[-1] == 10
        with pytest.raises(ValueError, match="interval_s"):
            MetricsScraper(url, interval_s=0)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_panel_frame_from_literal_text_and_missing_series():
    from workbench.monitoring.dashboard import PANELS, panel_frame

    rows = parse_exposition(exposition(0, 0, 0, {"0.1": 0, "+Inf": 0}), 100.0)
    rows += parse_exposition(exposition(1, 5, 10, {"0.1": 3, "+Inf": 4}), 101.0)
    panels = panel_frame(samples_frame(rows), window_s=2.0)
    assert list(panels.columns) == list(PANELS) and panels.index.tolist() == [0.0, 1.0]
    # 4 new requests: 3 under 0.1 s, 1 above; the median's rank 2 is 2/3 through (0, 0.1]
    assert panels["ttft_p50_s"].iloc[1] == pytest.approx(0.1 * 2 / 3)
    assert panels["ttft_p99_s"].iloc[1] == 0.1  # rank in +Inf: the top finite bound
    assert panels["prefix_hit_rate"].iloc[1] == 0.5
    assert panels[["running", "kv_usage", "acceptance_rate"]].isna().all().all()  # not in this exposition
