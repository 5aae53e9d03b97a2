"""Capacity planning: the seed's model recomputed (540 from its code, 546 in its prose, 541 rounded up), the
70B prefill floor at A100 peak, the step-cost fit, and the plans against numbers worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from workbench.models import model_spec
from workbench.monitoring.capacity import (
    StepCostModel,
    TrafficProfile,
    plan_from_step_costs,
    plan_from_sweep,
    prefill_floor_ms,
    replicas_for,
    seed_estimate,
)


def test_seed_example_and_its_rounding():
    seed = seed_estimate()  # 10 req/s, 2000-token prompts at 70 % hits, 300 output tokens, 50 ms/1k, 150 ms/token
    assert seed["total_ms_per_request"] == pytest.approx(45_030)
    assert seed["exact_gpus"] == pytest.approx(10 / (1000 / 45_030) * 1.2)  # 540.36
    assert (seed["code_result"], seed["text_result"], seed["ceil_result"]) == (540, 546, 541)
    assert replicas_for(10, 1000 / 45_030) == 541 and replicas_for(1, 0) == math.inf


def test_seed_prefill_figure_is_below_the_a100_floor():
    floor = prefill_floor_ms(model_spec("llama-3-70b"), 1000, peak_flops=312e12)  # A100 dense bf16 peak
    # ~2 x 70e9 weights x 1000 tokens / 312e12 = ~450 ms: the seed's 50 ms would be ~9x the A100's peak
    assert 400 < floor < 500 and floor / 50 > 8
    with pytest.raises(ValueError):
        prefill_floor_ms(model_spec("llama-3-70b"), 1000, peak_flops=0)


def test_step_cost_fit_recovers_known_costs():
    rng = np.random.default_rng(0)
    prefill, decode = rng.integers(0, 256, 200), rng.integers(0, 32, 200)
    ms = 4.0 + 0.05 * prefill + 0.7 * decode + rng.normal(0, 0.05, 200)
    costs = StepCostModel.fit(pd.DataFrame({"duration_s": ms / 1000, "num_prefill_tokens": prefill,
                                            "num_decode_seqs": decode}))
    assert (costs.fixed_ms, costs.prefill_ms_per_token, costs.decode_ms_per_seq) == pytest.approx(
        (4.0, 0.05, 0.7), abs=0.05)  # noise sd 0.05 ms over 200 steps: the intercept within ~0.03
    assert costs.r2 > 0.99
    with pytest.raises(ValueError, match="at least 4"):
        StepCostModel.fit(pd.DataFrame({"duration_s": [0.1], "num_prefill_tokens": [1], "num_decode_seqs": [1]}))


def test_plan_from_step_costs_by_hand():
    traffic = TrafficProfile(20, [100], [50], itl_slo_s=0.025, headroom=1.2)
    costs = StepCostModel(fixed_ms=10, prefill_ms_per_token=0.1, decode_ms_per_seq=1)
    plan = plan_from_step_costs(traffic, costs, kv_capacity_tokens=150 * 12, batch_sizes=(10, 12, 20))
    plan = plan.set_index("batch")
    # B = 10: a 20 ms decode step; per request 10 ms prefill + 50 x 20 / 10 ms decode = 110 ms -> 9.09 req/s;
    # prefill is 100 / 1100 of the time, so a token waits 20 / (1 - 1/11) = 22 ms; 24 req/s / 9.09 -> 3 replicas
    assert plan.loc[10, "rps_per_replica"] == pytest.approx(1000 / 110)
    assert plan.loc[10, "itl_ms"] == pytest.approx(22.0) and plan.loc[10, "replicas"] == 3
    assert plan.loc[12, "meets_itl"] and plan.loc[12, "kv_fits"]  # 22 ms step -> 24.2 ms ITL; 12 x 150 tokens
    assert not plan.loc[20, "kv_fits"] and not plan.loc[20, "meets_itl"]
    assert plan.loc[12, "replicas"] == 3  # 9.84 req/s: no fewer replicas, so the lower ITL (B = 10) is chosen
    assert plan["chosen"].sum() == 1 and plan.loc[10, "chosen"]


def test_tail_statistics_and_sweep_plan():
    traffic = TrafficProfile(6, list(range(1, 101)), [10] * 100, prefix_hit_rate=0.5, ttft_slo_s=0.5, itl_slo_s=0.05)
    assert traffic.tokens("mean") == pytest.approx((25.25, 10)) and traffic.tokens("p99")[0] == pytest.approx(49.505)
    sweep = pd.DataFrame({"request_rate": [1, 2, 4, 8], "request_throughput": [1.0, 2.0, 3.9, 5.0],
                          "ttft_p99_ms": [100, 150, 400, 3000], "itl_p99_ms": [20, 25, 40, 90]})
    plan = plan_from_sweep(traffic, sweep)
    assert plan["rps_per_replica"] == 3.9 and plan["replicas"] == math.ceil(6 * 1.2 / 3.9)
    with pytest.raises(ValueError, match="prefix_hit_rate"):
        TrafficProfile(1, [1], [1], prefix_hit_rate=1.5)
    with pytest.raises(ValueError, match="stat"):
        traffic.tokens("median")
