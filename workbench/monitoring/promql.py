"""What a Prometheus query does with scraped samples, on the long frame of `workbench.monitoring.scrape`:
``increase``/``rate`` of counters (with counter resets), ``histogram_quantile(q, rate(x_bucket[w]))``, and
ratios of counter increases (prefix-cache hit rate, speculative acceptance rate) over a trailing window.

Two simplifications against Prometheus, both said where they matter: a window's increase is the sum of the
positive steps between the scrapes inside it (Prometheus also extrapolates to the window's edges, which
changes a rate by at most one scrape interval's share and cancels out of ratios and quantiles), and a
window at time t covers the scrapes in ``[t - w, t]``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd


def select(frame: pd.DataFrame, name: str, **labels: str) -> pd.DataFrame:
    """The rows of sample ``name`` whose labels include ``labels`` (exact values)."""
    rows = frame[frame["name"] == name]
    for key, value in labels.items():
        rows = rows[rows["labels"].str.contains(f'{key}="{value}"', regex=False)]
    return rows


def _reset_adjusted(values: np.ndarray) -> np.ndarray:
    """A counter's running total with resets undone: after a drop the counter restarted from 0, so the new
    value is all growth since (Prometheus' rule)."""
    steps = np.diff(values, prepend=values[:1])
    steps = np.where(steps < 0, values, steps)
    return values[0] + np.cumsum(steps)


def counter(frame: pd.DataFrame, name: str, **labels: str) -> pd.Series:
    """Reset-adjusted counter summed over its series (``sum(x)`` with each series' resets undone first), by time."""
    rows = select(frame, name, **labels)
    if rows.empty:
        raise KeyError(f"no samples named {name!r}{' with ' + str(labels) if labels else ''}")
    parts = []
    for _, series in rows.groupby(["labels", "le"], dropna=False, sort=False):
        series = series.sort_values("time")
        parts.append(pd.Series(_reset_adjusted(series["value"].to_numpy()), index=series["time"].to_numpy()))
    return pd.concat(parts, axis=1).sort_index().ffill().fillna(0.0).sum(axis=1)


def increase(series: pd.Series, window_s: float) -> pd.Series:
    """At each time t, the growth of a reset-adjusted counter over ``[t - window_s, t]`` (NaN until the window
    holds two scrapes)."""
    _check_window(window_s)
    times, values = series.index.to_numpy(dtype=float), series.to_numpy(dtype=float)
    first = np.searchsorted(times, times - window_s, side="left")
    out = values - values[first]
    out[first == np.arange(len(times))] = np.nan
    return pd.Series(out, index=series.index)


def rate(series: pd.Series, window_s: float) -> pd.Series:
    """Per-second growth over the trailing window: increase divided by the time the scrapes in it span."""
    _check_window(window_s)
    times = series.index.to_numpy(dtype=float)
    first = np.searchsorted(times, times - window_s, side="left")
    span = times - times[first]
    with np.errstate(invalid="ignore", divide="ignore"):
        return increase(series, window_s) / np.where(span > 0, span, np.nan)


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """PromQL's ``histogram_quantile`` on one histogram: ``buckets`` are (upper bound ``le``, cumulative count)
    and must include ``+Inf``. The rank ``q * total`` falls in some bucket; the answer interpolates linearly
    between that bucket's lower and upper bounds (the lowest bucket's lower bound is 0). A rank in the
    ``+Inf`` bucket answers the highest finite bound; an empty histogram answers NaN."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted((float(le), float(count)) for le, count in buckets)
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return math.nan  # Prometheus needs +Inf and one finite bucket
    counts = np.maximum.accumulate([count for _, count in ordered])  # as Prometheus, repair non-monotonic counts
    total = counts[-1]
    if total <= 0 or math.isnan(total):
        return math.nan
    rank = q * total
    index = int(np.searchsorted(counts, rank, side="left"))
    if index == len(ordered) - 1:
        return ordered[-2][0]
    upper = ordered[index][0]
    if index == 0 and upper <= 0:
        return upper
    lower = 0.0 if index == 0 else ordered[index - 1][0]
    below = 0.0 if index == 0 else counts[index - 1]
    in_bucket = counts[index] - below
    return lower + (upper - lower) * (rank - below) / in_bucket if in_bucket > 0 else upper


def windowed_quantile(frame: pd.DataFrame, histogram: str, q: float, window_s: float, **labels: str) -> pd.Series:
    """``histogram_quantile(q, sum by (le) (rate(<histogram>_bucket[window])))`` at every scrape time: NaN where
    nothing was observed inside the window."""
    rows = select(frame, f"{histogram}_bucket", **labels)
    if rows.empty:
        raise KeyError(f"no buckets named {histogram}_bucket")
    growth = {}
    for le in sorted(rows["le"].unique()):
        growth[le] = increase(counter(rows[rows["le"] == le], f"{histogram}_bucket"), window_s)
    table = pd.DataFrame(growth).sort_index()
    values = [histogram_quantile(q, list(row.items())) if row.notna().all() else math.nan
              for _, row in table.iterrows()]
    return pd.Series(values, index=table.index, name=f"p{q * 100:g} {histogram}")


def ratio_of_increases(frame: pd.DataFrame, numerator: str, denominator: str, window_s: float) -> pd.Series:
    """increase(numerator[w]) / increase(denominator[w]): e.g. prefix-cache hit rate (hits / queries) or
    speculative acceptance rate (accepted / drafted tokens) over the trailing window; NaN where the denominator
    did not grow."""
    num = increase(counter(frame, numerator), window_s)
    den = increase(counter(frame, denominator), window_s).reindex(num.index)
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den.where(den > 0)


def gauge(frame: pd.DataFrame, name: str, **labels: str) -> pd.Series:
    """A gauge summed over its series, by scrape time."""
    rows = select(frame, name, **labels)
    if rows.empty:
        raise KeyError(f"no samples named {name!r}")
    return rows.groupby("time")["value"].sum()


def _check_window(window_s: float) -> None:
    if not (isinstance(window_s, int | float) and window_s > 0 and math.isfinite(window_s)):
        raise ValueError(f"the window must be a finite number of seconds > 0, got {window_s!r}")
