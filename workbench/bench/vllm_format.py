"""One benchmark run in the keys of ``vllm bench serve``'s result JSON, so one script reads both tools' results.

Follows ``vllm/benchmarks/serve.py`` (vLLM 0.33, ``calculate_metrics`` and ``benchmark`` at commit 009e6d4): each
latency statistic is ``<stat>_<metric>_ms`` with metric ``ttft``, ``tpot``, ``itl`` or ``e2el`` and stat ``mean``,
``median``, ``std`` and ``p<N>`` for each requested percentile (0.0 when there is no sample, as numpy gives vLLM);
the peak output throughput counts streamed chunks (one token each, as vLLM counts them) in one-second bins that
start at the earliest send of a successful request, and the peak concurrency sweeps the successful requests'
[send, end) intervals, an end before a send at the same instant. The per-request lists hold every request, failed
ones included (``errors`` is "" for a success, its TTFT 0.0, its output length 0); as vLLM's file without
``--save-detailed`` keeps only ``latencies`` and ``queue_times`` (the time a request waited for a free slot
under ``--concurrency``), ``detailed`` adds the others.
"""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import pandas as pd

VLLM_METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2e_s"}  # vLLM's name -> our per-request column
# Kept only with detailed=True (vLLM's --save-detailed)
DETAILED_KEYS = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors")


def _stats(values_s: np.ndarray, metric: str, percentiles: tuple[float, ...]) -> dict[str, float]:
    data = values_s[~np.isnan(values_s)] * 1e3
    if len(data) == 0:
        data = np.zeros(1)  # vLLM: np.mean(values or 0)
    out = {f"mean_{metric}_ms": float(data.mean()), f"median_{metric}_ms": float(np.median(data)),
           f"std_{metric}_ms": float(data.std())}
    for p in percentiles:
        out[f"p{p:g}_{metric}_ms"] = float(np.percentile(data, p))
    return out


def token_times(requests: pd.DataFrame, itl: pd.DataFrame) -> list[np.ndarray]:
    """Each successful request's chunk arrival times (seconds from the run's clock): its first chunk at
    start + TTFT, then one per inter-chunk gap."""
    gaps = {index: group.sort_values("chunk")["itl_s"].to_numpy() for index, group in itl.groupby("index")}
    out = []
    for row in requests.itertuples():
        if not row.success or math.isnan(row.ttft_s):
            continue
        first = row.start_s + row.ttft_s
        out.append(first + np.concatenate([[0.0], np.cumsum(gaps.get(row.index, np.array([])))]))
    return out


def peak_output_throughput(times: list[np.ndarray], first_send_s: float) -> float:
    """The most chunks (tokens) that arrived within one second, in bins from ``first_send_s`` (vLLM's origin: the
    earliest send of a successful request)."""
    if not times:
        return 0.0
    bins = np.floor(np.concatenate(times) - first_send_s).astype(int)
    return float(np.bincount(bins[bins >= 0]).max()) if (bins >= 0).any() else 0.0


def peak_concurrency(requests: pd.DataFrame) -> int:
    """The most successful requests in flight at once: a sweep over [sent, complete), an end before a start at the
    same instant."""
    ok = requests[requests["success"].astype(bool)]
    events = sorted([(s, 1) for s in ok["start_s"]] + [(e, -1) for e in ok["end_s"].dropna()],
                    key=lambda event: (event[0], event[1]))
    level = peak = 0
    for _, change in events:
        level += change
        peak = max(peak, level)
    return peak


def vllm_result(result, percentiles: tuple[float, ...] = (99,), detailed: bool = False) -> dict:
    """``result`` (a ``ServingBenchResult``) as ``vllm bench serve`` writes it with ``--save-result`` (and
    ``--save-detailed`` with ``detailed``)."""
    requests, itl, summary, config = result.requests, result.itl, result.summary, result.config
    success = requests["success"].astype(bool)
    ok = requests[success]
    backend = "openai-chat" if len(ok) and set(ok["endpoint"]) == {"chat"} else "openai"
    out = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": backend, "backend": backend,
        "label": config.get("label") or backend, "model_id": config.get("model"),
        "tokenizer_id": config.get("tokenizer") or config.get("model"), "num_prompts": len(requests),
        "request_rate": config.get("request_rate", "inf"), "burstiness": 1.0,  # Poisson arrivals
        "max_concurrency": config.get("concurrency"),
        "duration": summary["duration_s"], "completed": summary["completed"], "failed": summary["failed"],
        "total_input_tokens": summary["prompt_tokens"], "total_output_tokens": summary["output_tokens"],
        "request_throughput": summary["request_throughput"], "request_goodput": summary.get("goodput"),
        "output_throughput": summary["output_throughput"],
        "total_token_throughput": summary["total_token_throughput"],
        "input_lens": [int(x) if x == x and x is not None else 0 for x in requests["prompt_tokens"]],
        "output_lens": [int(n) if good and n == n else 0 for good, n in zip(success, requests["output_tokens"],
                                                                              strict=True)],
        "ttfts": [float(t) if good and t == t else 0.0 for good, t in zip(success, requests["ttft_s"], strict=True)],
        "itls": _itls(requests, itl),
        "latencies": [float(x) if x == x else 0.0 for x in requests["e2e_s"]],
        "start_times": [float(x) for x in requests["start_s"]],
        "queue_times": [float(x) for x in requests.get("client_queue_s", pd.Series(0.0, index=requests.index))],
        "generated_texts": [str(x) if x == x and x is not None else "" for x in requests.get(
            "text", pd.Series("", index=requests.index))],
        "errors": ["" if good else str(e) for good, e in zip(success, requests["error"], strict=True)],
        "max_output_tokens_per_s": peak_output_throughput(token_times(requests, itl),
                                                          float(ok["start_s"].min()) if len(ok) else 0.0),
        "max_concurrent_requests": peak_concurrency(requests), "rtfx": 0.0,
    }
    if not detailed:
        for key in DETAILED_KEYS:
            del out[key]
    for metric, column in VLLM_METRICS.items():
        out.update(_stats(ok[column].to_numpy(dtype=float), metric, percentiles))
    ok_itl = itl[itl["index"].isin(ok["index"])]["itl_s"].to_numpy(dtype=float)
    out.update(_stats(ok_itl, "itl", percentiles))
    return out


def _itls(requests: pd.DataFrame, itl: pd.DataFrame) -> list[list[float]]:
    gaps = {index: group.sort_values("chunk")["itl_s"].tolist() for index, group in itl.groupby("index")}
    return [gaps.get(index, []) for index in requests["index"]]


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``"50,90,99"`` -> (50, 90, 99); each in (0, 100)."""
    try:
        values = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ValueError(f"percentiles must be numbers separated by commas, e.g. 50,90,99; got {text!r}") from None
    if not values or not all(0 < p < 100 for p in values):
        raise ValueError(f"percentiles must be in (0, 100), got {text!r}")
    return values
