"""The vLLM form of a benchmark result, on hand-built rows whose answers are known."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from workbench.bench.runner import ServingBenchResult
from workbench.bench.stats import summarize
from workbench.bench.vllm_format import parse_percentiles, peak_concurrency, vllm_result


def _result() -> ServingBenchResult:
    # Request 0: sent at 0, first chunk at 0.5, then chunks 0.2 s apart (4 chunks), done at 1.1.
    # Request 1: sent at 0.2, first chunk at 1.2, one more at 1.3, done at 1.3. Request 2 failed.
    requests = pd.DataFrame([
        {"index": 0, "endpoint": "chat", "success": True, "error": None, "start_s": 0.0, "end_s": 1.1,
         "ttft_s": 0.5, "tpot_s": 0.2, "e2e_s": 1.1, "prompt_tokens": 10, "output_tokens": 4},
        {"index": 1, "endpoint": "chat", "success": True, "error": None, "start_s": 0.2, "end_s": 1.3,
         "ttft_s": 1.0, "tpot_s": 0.1, "e2e_s": 1.1, "prompt_tokens": 20, "output_tokens": 2},
        {"index": 2, "endpoint": "chat", "success": False, "error": "HTTP 500", "start_s": 0.3, "end_s": 0.4,
         "ttft_s": math.nan, "tpot_s": math.nan, "e2e_s": 0.1, "prompt_tokens": None, "output_tokens": None},
    ])
    itl = pd.DataFrame([{"index": 0, "chunk": i, "itl_s": 0.2} for i in (1, 2, 3)]
                       + [{"index": 1, "chunk": 1, "itl_s": 0.1}])
    summary = summarize(requests, itl, 1.3)
    return ServingBenchResult(requests, itl, summary, {"model": "m", "request_rate": "inf", "concurrency": None})


# vLLM's default --save-result keys (vllm/benchmarks/serve.py@009e6d4 benchmark() and main_async(), with the default
# --percentile-metrics ttft,tpot,itl and --metric-percentiles 99); this tool also writes the e2el statistics.
VLLM_DEFAULT_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput", "latencies",
    "queue_times", "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    *(f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl") for stat in ("mean", "median", "std", "p99"))}


def test_keys_and_values_follow_vllm():
    out = vllm_result(_result(), (50, 99))
    assert out.keys() >= VLLM_DEFAULT_KEYS, VLLM_DEFAULT_KEYS - out.keys()
    assert "errors" not in out and "ttfts" not in out  # only with --save-detailed, as in vLLM
    assert out["completed"] == 2 and out["failed"] == 1 and out["request_goodput"] is None
    assert out["mean_ttft_ms"] == pytest.approx(750) and out["median_ttft_ms"] == pytest.approx(750)
    assert out["std_ttft_ms"] == pytest.approx(250)
    assert out["mean_itl_ms"] == pytest.approx((3 * 200 + 100) / 4)
    assert out["mean_e2el_ms"] == pytest.approx(1100) and "p99_tpot_ms" in out
    # vLLM's bins start at the first send of a successful request (0): chunks at 0.5, 0.7, 0.9 in [0, 1); 1.1, 1.2,
    # 1.3 in [1, 2): 3 per second at most.
    assert out["max_output_tokens_per_s"] == 3
    # Successful requests only, [0, 1.1) and [0.2, 1.3) overlap: 2 (the failed one at [0.3, 0.4) does not count).
    assert out["max_concurrent_requests"] == 2 == peak_concurrency(_result().requests)
    assert out["backend"] == out["endpoint_type"] == out["label"] == "openai-chat" and out["rtfx"] == 0.0
    assert out["latencies"] == pytest.approx([1.1, 1.1, 0.1])


def test_detailed_lists_hold_every_request_in_order():
    """vLLM's --save-detailed lists: one entry per request, the failed one included, so they zip."""
    out = vllm_result(_result(), (99,), detailed=True)
    assert out["input_lens"] == [10, 20, 0] and out["output_lens"] == [4, 2, 0]
    assert out["ttfts"] == pytest.approx([0.5, 1.0, 0.0]) and out["errors"] == ["", "", "HTTP 500"]
    assert out["itls"] == [[0.2, 0.2, 0.2], [0.1], []] and out["start_times"] == [0.0, 0.2, 0.3]


def test_an_empty_statistic_is_zero_as_in_vllm():
    result = _result()
    result.itl = result.itl.iloc[0:0]
    out = vllm_result(result, (99,))
    assert out["mean_itl_ms"] == 0.0 == out["p99_itl_ms"]


def test_percentiles_are_checked():
    assert parse_percentiles("50, 90,99.9") == (50, 90, 99.9)
    for bad in ("", "0", "100", "x"):
        with pytest.raises(ValueError, match="percentiles"):
            parse_percentiles(bad)
