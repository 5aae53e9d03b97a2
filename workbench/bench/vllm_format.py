"""One benchmark run in the keys of ``vllm bench serve``'s result JSON, so one script reads both tools' results.

vLLM (0.10-0.11, ``vllm bench serve``) names each latency statistic ``<stat>_<metric>_ms``
with metric ``ttft``, ``tpot``, ``itl`` or ``e2el`` and stat ``mean``, ``median``, ``std`` and ``p<N>`` for each
requested percentile, and adds the peak output throughput (the most output tokens in any one second of the
run, a streamed chunk counted as one token, as vLLM counts them) and the peak number of requests in flight.
Where this tool's own summary uses other names (``ttft_mean_ms``, ``e2e``), the vLLM form maps them here; the
numbers are computed from the same per-request rows.
"""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import pandas as pd

VLLM_METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2e_s"}  # vLLM's name -> our per-request column


def _stats(values_s: np.ndarray, metric: str, percentiles: tuple[float, ...]) -> dict[str, float]:
    data = values_s[~np.isnan(values_s)] * 1e3
    empty = len(data) == 0
    out = {f"mean_{metric}_ms": math.nan if empty else float(data.mean()),
           f"median_{metric}_ms": math.nan if empty else float(np.median(data)),
           f"std_{metric}_ms": math.nan if empty else float(data.std())}
    for p in percentiles:
        out[f"p{p:g}_{metric}_ms"] = math.nan if empty else float(np.percentile(data, p))
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


def peak_output_throughput(times: list[np.ndarray]) -> float:
    """The most chunks (tokens) that arrived within any one-second bin of the run."""
    if not times:
        return 0.0
    every = np.concatenate(times)
    bins = np.floor(every - every.min()).astype(int)
    return float(np.bincount(bins).max())


def peak_concurrency(requests: pd.DataFrame) -> int:
    """The most requests in flight at once (sent, not yet complete)."""
    events = sorted([(s, 1) for s in requests["start_s"]] + [(e, -1) for e in requests["end_s"].dropna()],
                    key=lambda event: (event[0], event[1]))
    level = peak = 0
    for _, change in events:
        level += change
        peak = max(peak, level)
    return peak


def vllm_result(result, percentiles: tuple[float, ...] = (99,)) -> dict:
    """``result`` (a ``ServingBenchResult``) as ``vllm bench serve`` writes it with ``--save-result``."""
    requests, itl, summary, config = result.requests, result.itl, result.summary, result.config
    ok = requests[requests["success"].astype(bool)]
    out = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "openai-chat" if set(ok["endpoint"]) == {"chat"}
        else "openai", "model_id": config.get("model"), "num_prompts": len(requests),
        "request_rate": config.get("request_rate", "inf"), "max_concurrency": config.get("concurrency"),
        "duration": summary["duration_s"], "completed": summary["completed"], "failed": summary["failed"],
        "total_input_tokens": summary["prompt_tokens"], "total_output_tokens": summary["output_tokens"],
        "request_throughput": summary["request_throughput"], "output_throughput": summary["output_throughput"],
        "total_token_throughput": summary["total_token_throughput"],
        "max_output_tokens_per_s": peak_output_throughput(token_times(requests, itl)),
        "max_concurrent_requests": peak_concurrency(requests),
        "input_lens": [int(x) for x in ok["prompt_tokens"].fillna(0)],
        "output_lens": [int(x) for x in ok["output_tokens"].fillna(0)],
        "ttfts": [float(x) for x in ok["ttft_s"]],
        "errors": [str(e) for e in requests.loc[~requests["success"].astype(bool), "error"]],
    }
    if "goodput" in summary:
        out["request_goodput"] = summary["goodput"]
    for metric, column in VLLM_METRICS.items():
        out.update(_stats(ok[column].to_numpy(dtype=float), metric, percentiles))
    ok_itl = itl[itl["index"].isin(ok["index"])]["itl_s"].to_numpy(dtype=float)
    out.update(_stats(ok_itl, "itl", percentiles))
    return out


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``"50,90,99"`` -> (50, 90, 99); each in (0, 100)."""
    try:
        values = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ValueError(f"percentiles must be numbers separated by commas, e.g. 50,90,99; got {text!r}") from None
    if not values or not all(0 < p < 100 for p in values):
        raise ValueError(f"percentiles must be in (0, 100), got {text!r}")
    return values
