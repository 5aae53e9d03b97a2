"""Alerting on rate of change: a quantity against its own trailing baseline, not against a fixed threshold.

The seed's advice ("TTFT P95 > 2x baseline"; "the most useful alert threshold is rate of change") as a rule:

    rule = ChangeAlert("p99 TTFT doubled", factor=2.0, baseline_s=20, hold_s=2)
    result = rule.evaluate(p99_ttft)         # a time-indexed series, e.g. promql.windowed_quantile(...)
    result.fired_at                          # the first time it fired (None: it never did)

At each time t the baseline is the median of the series over ``[t - gap_s - baseline_s, t - gap_s)``: the
median so that one outlier in the baseline does not move it, and a gap so that a slow climb does not drag its
own baseline up as it goes. The rule is *pending* while ``value > factor * baseline``, and *firing* once it has
been pending for ``hold_s`` seconds (Prometheus' ``for:``), so a single slow request does not page anyone.
A baseline needs ``min_points`` finite values; before that, nothing fires.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True, slots=True)
class AlertResult:
    table: pd.DataFrame  # per time: value, baseline, ratio, pending, firing
    fired_at: float | None  # first time the rule was firing

    @property
    def fired(self) -> bool:
        return self.fired_at is not None


@dataclass(frozen=True, slots=True)
class ChangeAlert:
    name: str
    factor: float = 2.0  # fire when the value exceeds factor x its baseline
    baseline_s: float = 30.0  # length of the trailing baseline window
    gap_s: float = 0.0  # how far before now the baseline window ends
    hold_s: float = 0.0  # how long the condition must hold before firing (Prometheus' `for:`)
    min_points: int = 3  # finite values the baseline needs

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor > 1):
            raise ValueError(f"factor must be a finite number > 1, got {self.factor!r}")
        for field_name in ("baseline_s", "gap_s", "hold_s"):
            value = getattr(self, field_name)
            if not (math.isfinite(value) and value >= 0) or (field_name == "baseline_s" and value == 0):
                raise ValueError(f"{field_name} must be a finite number of seconds >= 0 (baseline_s > 0), "
                                 f"got {value!r}")
        if not (isinstance(self.min_points, int) and self.min_points >= 1):
            raise ValueError(f"min_points must be an integer >= 1, got {self.min_points!r}")

    def baselines(self, series: pd.Series) -> np.ndarray:
        times, values = series.index.to_numpy(dtype=float), series.to_numpy(dtype=float)
        out = np.full(len(times), np.nan)
        for i, t in enumerate(times):
            inside = (times >= t - self.gap_s - self.baseline_s) & (times < t - self.gap_s)
            window = values[inside]
            window = window[np.isfinite(window)]
            if len(window) >= self.min_points:
                out[i] = float(np.median(window))
        return out

    def evaluate(self, series: pd.Series) -> AlertResult:
        series = series.sort_index()
        times, values = series.index.to_numpy(dtype=float), series.to_numpy(dtype=float)
        baseline = self.baselines(series)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = values / baseline
        pending = np.nan_to_num(ratio, nan=0.0) > self.factor
        firing = np.zeros(len(times), dtype=bool)
        since: float | None = None
        for i, t in enumerate(times):
            since = (t if since is None else since) if pending[i] else None
            firing[i] = since is not None and t - since >= self.hold_s
        table = pd.DataFrame({"time": times, "value": values, "baseline": baseline, "ratio": ratio,
                              "pending": pending, "firing": firing})
        fired_at = float(times[firing.argmax()]) if firing.any() else None
        return AlertResult(table, fired_at)
