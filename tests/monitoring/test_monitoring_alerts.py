"""The rate-of-change alert: fires when a quantity doubles against its own trailing baseline (and says when),
stays quiet under steady noise, waits for its hold time, and needs a baseline before it can fire."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.monitoring.alerts import ChangeAlert


def noisy(seconds: int, level: float, seed: int, start: float = 0.0) -> pd.Series:
    rng = np.random.default_rng(seed)
    times = start + np.arange(seconds, dtype=float)
    return pd.Series(level * rng.uniform(0.8, 1.25, seconds), index=times)  # +-25 %: never 2x of the median


def test_fires_on_a_step_and_says_when():
    series = pd.concat([noisy(60, 0.2, 0), noisy(30, 0.6, 1, start=60)])  # p99 TTFT triples at t = 60
    result = ChangeAlert("p99 TTFT doubled", factor=2.0, baseline_s=20, hold_s=2).evaluate(series)
    assert result.fired and result.fired_at == 62.0  # pending from 60, held for 2 s
    table = result.table.set_index("time")
    assert not table.loc[:59, "pending"].any() and table.loc[60:62, "pending"].all()


def test_quiet_under_steady_noise_and_before_a_baseline():
    assert not ChangeAlert("x", factor=2.0, baseline_s=20).evaluate(noisy(300, 0.2, 2)).fired
    early = pd.Series([0.1, 5.0, 5.0], index=[0.0, 1.0, 2.0])  # a jump before three baseline points exist
    assert not ChangeAlert("x", baseline_s=20, min_points=3).evaluate(early).fired


def test_hold_time_ignores_a_blip_and_a_gap_keeps_the_baseline_from_chasing_a_climb():
    series = noisy(60, 0.2, 3)
    series.loc[40.0] = 1.0  # one slow scrape
    assert not ChangeAlert("x", baseline_s=20, hold_s=1).evaluate(series).fired
    assert ChangeAlert("x", baseline_s=20, hold_s=0).evaluate(series).fired_at == 40.0
    climb = pd.Series(0.2 * 1.03 ** np.arange(120.0), index=np.arange(120.0))  # +3 % per second
    assert not ChangeAlert("x", baseline_s=10, gap_s=0).evaluate(climb).fired  # the baseline climbs along
    assert ChangeAlert("x", baseline_s=10, gap_s=30).evaluate(climb).fired  # a baseline 30 s back does not


@pytest.mark.parametrize("bad", [{"factor": 1.0}, {"baseline_s": 0}, {"hold_s": -1}, {"min_points": 0}])
def test_rejects_bad_rules(bad):
    with pytest.raises(ValueError):
        ChangeAlert("x", **bad)
