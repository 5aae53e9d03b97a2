"""From per-request records to the numbers a serving benchmark reports.

    TTFT   first chunk - sent                        per request
    TPOT   (last chunk - first chunk) / (tokens - 1) per request, tokens from the server's usage
    ITL    gaps between consecutive chunks           per chunk, pooled over requests
    e2e    response complete - sent                  per request

Throughput divides by the benchmark's duration (first send to last completion). *Goodput* counts only the
requests that met every service-level objective given (``--slo ttft=500,tpot=50``, in milliseconds): the
request rate a deployment can sustain while keeping its promises (DistServe, Zhong et al., OSDI 2024).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from workbench.bench.client import RequestRecord

SLO_METRICS = ("ttft", "tpot", "itl", "e2e")
DEFAULT_PERCENTILES = (50, 90, 99)


def parse_slo(slo: str | dict[str, float] | None) -> dict[str, float]:
    """SLOs in milliseconds from ``"ttft=500,tpot=50"`` or a dict; keys among ttft, tpot, itl, e2e."""
    if slo is None:
        return {}
    if isinstance(slo, str):
        items = {}
        for part in filter(None, (p.strip() for p in slo.split(","))):
            name, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"SLO {part!r} must look like name=milliseconds, e.g. ttft=500")
            try:
                items[name.strip()] = float(value)
            except ValueError:
                raise ValueError(f"SLO {name.strip()!r} must be a number of milliseconds, got {value!r}") from None
        slo = items
    for name, value in slo.items():
        if name not in SLO_METRICS:
            raise ValueError(f"unknown SLO {name!r}: choose among {SLO_METRICS}")
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"SLO {name} must be a positive number of milliseconds, got {value!r}")
    return {name: float(value) for name, value in slo.items()}


def request_row(record: RequestRecord) -> dict:
    """One per-request row, times in seconds (NaN where a request never produced them)."""
    times = record.chunk_times
    ttft = times[0] - record.start_s if times else math.nan
    gaps = np.diff(times) if len(times) > 1 else np.array([])
    tokens = record.output_tokens if record.output_tokens is not None else len(times)
    tpot = (times[-1] - times[0]) / (tokens - 1) if len(times) > 1 and tokens > 1 else math.nan
    return {
        "index": record.index, "request_id": record.request_id, "endpoint": record.endpoint,
        "success": record.success, "status": record.status, "error": record.error,
        "start_s": record.start_s, "end_s": record.end_s, "ttft_s": ttft, "tpot_s": tpot,
        "e2e_s": (record.end_s - record.start_s) if record.end_s is not None else math.nan,
        "mean_itl_s": float(gaps.mean()) if len(gaps) else math.nan,
        "max_itl_s": float(gaps.max()) if len(gaps) else math.nan,
        "prompt_tokens": record.prompt_tokens, "output_tokens": tokens, "cached_tokens": record.cached_tokens,
        "num_chunks": len(times), "usage_reported": record.usage_reported, "finish_reason": record.finish_reason,
    }


def itl_rows(record: RequestRecord) -> list[dict]:
    times = record.chunk_times
    return [{"index": record.index, "chunk": i, "itl_s": b - a}
            for i, (a, b) in enumerate(zip(times, times[1:], strict=False), start=1)]


def meets_slo(requests: pd.DataFrame, slo: dict[str, float]) -> pd.Series:
    """Per request: succeeded and within every SLO (a missing value, e.g. TPOT of a 1-token reply, passes)."""
    good = requests["success"].astype(bool)
    columns = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "max_itl_s", "e2e": "e2e_s"}
    for name, limit_ms in slo.items():
        values = requests[columns[name]]
        good &= values.isna() | (values * 1e3 <= limit_ms)
    return good


def _distribution(values: pd.Series, name: str, percentiles: tuple[int, ...]) -> dict[str, float]:
    data = values.dropna().to_numpy(dtype=float) * 1e3
    out = {f"{name}_mean_ms": float(data.mean()) if len(data) else math.nan}
    for p in percentiles:
        label = "median" if p == 50 else f"p{p:g}"
        out[f"{name}_{label}_ms"] = float(np.percentile(data, p)) if len(data) else math.nan
    return out


def summarize(requests: pd.DataFrame, itl: pd.DataFrame, duration_s: float, slo: dict[str, float] | None = None,
              percentiles: tuple[int, ...] = DEFAULT_PERCENTILES) -> dict[str, float]:
    """Counts, throughput, goodput and latency distributions (ms) of one benchmark run."""
    ok = requests[requests["success"].astype(bool)]
    output_tokens = int(ok["output_tokens"].fillna(0).sum())
    prompt_tokens = int(ok["prompt_tokens"].fillna(0).sum())
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: math.nan)
    summary: dict[str, float] = {
        "completed": len(ok), "failed": len(requests) - len(ok), "duration_s": duration_s,
        "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
        "request_throughput": per_s(len(ok)), "output_throughput": per_s(output_tokens),
        "total_token_throughput": per_s(output_tokens + prompt_tokens),
    }
    if slo:
        good = int(meets_slo(requests, slo).sum())
        summary.update(good_requests=good, goodput=per_s(good))
    summary.update(_distribution(ok["ttft_s"], "ttft", percentiles))
    summary.update(_distribution(ok["tpot_s"], "tpot", percentiles))
    ok_itl = itl[itl["index"].isin(ok["index"])] if len(itl) else itl
    summary.update(_distribution(ok_itl["itl_s"] if len(ok_itl) else pd.Series(dtype=float), "itl", percentiles))
    summary.update(_distribution(ok["e2e_s"], "e2e", percentiles))
    return summary


def summary_table(summary: dict[str, float]) -> pd.DataFrame:
    """The latency part of a summary as metric x statistic (ms), for printing or plotting."""
    rows: dict[str, dict[str, float]] = {}
    for key, value in summary.items():
        for metric in ("ttft", "tpot", "itl", "e2e"):
            prefix = f"{metric}_"
            if key.startswith(prefix) and key.endswith("_ms"):
                rows.setdefault(metric, {})[key[len(prefix):-3]] = value
    return pd.DataFrame(rows).T
