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


def test_keys_and_values_follow_vllm():
    out = vllm_result(_result(), (50, 99))
    assert out["completed"] == 2 and out["failed"] == 1 and out["errors"] == ["HTTP 500"]
    assert out["mean_ttft_ms"] == pytest.approx(750) and out["median_ttft_ms"] == pytest.approx(750)
    assert out["std_ttft_ms"] == pytest.approx(250)
    assert out["mean_itl_ms"] == pytest.approx((3 * 200 + 100) / 4)
    assert out["mean_e2el_ms"] == pytest.approx(1100) and "p99_tpot_ms" in out
    # Chunks at 0.5, 0.7, 0.9, 1.1 (request 0) and 1.2, 1.3 (request 1): 1-second bins from the first chunk:
    # [0.5, 1.5) holds all six.
    assert out["max_output_tokens_per_s"] == 6
    assert out["max_concurrent_requests"] == 3 == peak_concurrency(_result().requests)
    assert out["backend"] == "openai-chat" and out["input_lens"] == [10, 20]


def test_percentiles_are_checked():
    assert parse_percentiles("50, 90,99.9") == (50, 90, 99.9)
    for bad in ("", "0", "100", "x"):
        with pytest.raises(ValueError, match="percentiles"):
            parse_percentiles(bad)
