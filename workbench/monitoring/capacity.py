"""Capacity planning from measurement: how many replicas a traffic profile needs under its SLOs.

Two routes, both from numbers this workbench measures rather than typed-in constants:

- ``StepCostModel.fit(engine.metrics.step_frame())``: the engine's step time as ``fixed + per prefill token +
  per decoding sequence`` (least squares over real steps). ``plan_from_step_costs`` then asks, for each decode
  batch size B, what ITL a step of B decodes (plus its share of prefill) has, how many requests per second a
  replica sustains at that batch, and whether B requests' KV fits; among the Bs that meet the ITL SLO and fit,
  the plan takes the one needing the fewest replicas (``ceil(rate * headroom / capacity)``), the smallest such B
  on a tie, which keeps ITL lowest.
- ``plan_from_sweep``: a load sweep with the benchmark client (``run_benchmark`` at several request rates)
  gives p99 TTFT and ITL per rate; the highest rate that meets both SLOs is one replica's capacity.

``seed_estimate`` recomputes the seed's back-of-envelope model exactly and shows where its numbers slip;
``prefill_floor_ms`` is the least time a prefill can take at a device's peak FLOP rate (the seed's 50 ms per
1k tokens for a 70B model is below it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from workbench.config import ModelSpec
from workbench.roofline.counts import count_step, prefill_work


@dataclass(frozen=True, slots=True)
class TrafficProfile:
    request_rate: float  # requests per second to serve (a peak, not a mean, for sizing)
    prompt_tokens: Sequence[int]  # samples of the prompt-length distribution
    output_tokens: Sequence[int]  # samples of the output-length distribution
    prefix_hit_rate: float = 0.0  # share of prompt tokens served from the prefix cache
    ttft_slo_s: float = 1.0  # p99 targets
    itl_slo_s: float = 0.1
    headroom: float = 1.2  # spare capacity for bursts (the seed's 20 %)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.request_rate) and self.request_rate > 0):
            raise ValueError(f"request_rate must be a finite number > 0, got {self.request_rate!r}")
        for name in ("prompt_tokens", "output_tokens"):
            values = np.asarray(getattr(self, name), dtype=float)
            if values.ndim != 1 or len(values) == 0 or (values < 0).any() or not np.isfinite(values).all():
                raise ValueError(f"{name} must be a non-empty list of token counts >= 0")
        if not 0 <= self.prefix_hit_rate <= 1:
            raise ValueError(f"prefix_hit_rate must be in [0, 1], got {self.prefix_hit_rate!r}")
        if not (self.ttft_slo_s > 0 and self.itl_slo_s > 0 and self.headroom >= 1):
            raise ValueError("the SLOs must be > 0 seconds and headroom >= 1")

    def tokens(self, stat: str = "mean") -> tuple[float, float]:
        """(uncached prompt tokens, output tokens) per request at ``stat``: ``mean`` or ``p50``/``p95``/``p99``."""
        pick = np.mean if stat == "mean" else (lambda v: np.percentile(v, float(stat.lstrip("p"))))
        if stat != "mean" and not (stat.startswith("p") and stat[1:].isdigit()):
            raise ValueError(f"stat must be 'mean' or a percentile like 'p95', got {stat!r}")
        prompt = float(pick(np.asarray(self.prompt_tokens, dtype=float))) * (1 - self.prefix_hit_rate)
        return prompt, float(pick(np.asarray(self.output_tokens, dtype=float)))


@dataclass(frozen=True, slots=True)
class StepCostModel:
    fixed_ms: float  # per step, whatever it holds
    prefill_ms_per_token: float
    decode_ms_per_seq: float
    r2: float = float("nan")  # of the fit

    @classmethod
    def fit(cls, steps: pd.DataFrame) -> StepCostModel:
        """Least squares over an engine's step frame (``duration_s``, ``num_prefill_tokens``, ``num_decode_seqs``)."""
        if len(steps) < 4:
            raise ValueError(f"need at least 4 steps to fit 3 costs, got {len(steps)}")
        x = np.column_stack([np.ones(len(steps)), steps["num_prefill_tokens"], steps["num_decode_seqs"]]).astype(float)
        y = steps["duration_s"].to_numpy(dtype=float) * 1000
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        residual = y - x @ coef
        r2 = 1 - float(residual @ residual) / float(((y - y.mean()) ** 2).sum()) if y.std() > 0 else float("nan")
        return cls(float(coef[0]), float(coef[1]), float(coef[2]), r2)

    def step_ms(self, prefill_tokens: float, decode_seqs: float) -> float:
        return self.fixed_ms + self.prefill_ms_per_token * prefill_tokens + self.decode_ms_per_seq * decode_seqs


def replicas_for(request_rate: float, per_replica_rate: float, headroom: float = 1.2) -> float:
    """Replicas to carry ``request_rate`` with ``headroom``: rounded up, never to the nearest (half of a replica
    short is still short); inf when a replica cannot carry any of it."""
    if not per_replica_rate > 0:
        return math.inf
    return max(1, math.ceil(request_rate * headroom / per_replica_rate - 1e-9))


def plan_from_step_costs(traffic: TrafficProfile, costs: StepCostModel, *, kv_capacity_tokens: int,
                         batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
                         stat: str = "mean") -> pd.DataFrame:
    """One row per decode batch size B: step and ITL time, requests/s one replica sustains, whether the ITL SLO
    holds and B requests' KV fits, and the replicas needed. ``chosen`` marks the feasible row with the fewest
    replicas (the smallest such batch, so the lowest ITL, on a tie).

    A replica kept busy at batch B spends, per request, ``prompt * prefill_ms_per_token`` on its prefill and
    ``output * step_ms(0, B) / B`` on its share of decode steps (a step advances B requests by one token), which
    gives the requests/s. Prefill is chunked into the decode steps, so a token's ITL is the decode step
    stretched by the prefill share of the replica's time: ``step_ms(0, B) / (1 - prefill share)``."""
    prompt, output = traffic.tokens(stat)
    context = prompt / max(1 - traffic.prefix_hit_rate, 1e-9) + output  # a request's KV, cached part included
    rows = []
    for batch in batch_sizes:
        decode_ms = costs.step_ms(0, batch)
        prefill_ms = prompt * costs.prefill_ms_per_token  # per request
        rate = batch * 1000 / (batch * prefill_ms + output * decode_ms)  # at saturation
        prefill_share = batch * prefill_ms / (batch * prefill_ms + output * decode_ms)
        itl_ms = decode_ms / (1 - prefill_share) if prefill_share < 1 else math.inf
        rows.append({"batch": batch, "decode_step_ms": decode_ms, "itl_ms": itl_ms, "rps_per_replica": rate,
                     "meets_itl": itl_ms <= traffic.itl_slo_s * 1000, "kv_fits": batch * context <= kv_capacity_tokens,
                     "replicas": replicas_for(traffic.request_rate, rate, traffic.headroom)})
    table = pd.DataFrame(rows)
    feasible = table[table["meets_itl"] & table["kv_fits"]]
    table["chosen"] = False
    if not feasible.empty:
        table.loc[feasible["replicas"].astype(float).idxmin(), "chosen"] = True
    return table


def plan_from_sweep(traffic: TrafficProfile, sweep: pd.DataFrame) -> dict[str, float]:
    """``sweep``: one row per benchmark run with ``request_rate``, ``ttft_p99_ms``, ``itl_p99_ms`` and
    ``request_throughput`` (the client's summary keys). One replica's capacity is the highest throughput of a run
    that met both p99 SLOs."""
    ok = sweep[(sweep["ttft_p99_ms"] <= traffic.ttft_slo_s * 1000) & (sweep["itl_p99_ms"] <= traffic.itl_slo_s * 1000)]
    capacity = float(ok["request_throughput"].max()) if not ok.empty else 0.0
    return {"rps_per_replica": capacity, "replicas": replicas_for(traffic.request_rate, capacity, traffic.headroom),
            "rate_tested_max": float(sweep["request_rate"].max())}


def measure_sweep(url: str, workload: list, rates: Sequence[float], *, seed: int = 0) -> pd.DataFrame:
    """The benchmark client at each request rate (Poisson arrivals) against ``url``: one row per rate with the
    columns ``plan_from_sweep`` reads, plus output throughput."""
    from workbench.bench.runner import run_benchmark  # httpx is only needed here

    rows = []
    for rate in rates:
        summary = run_benchmark(url, workload, request_rate=rate, seed=seed, progress=False).summary
        rows.append({"request_rate": rate, **{key: summary[key] for key in (
            "request_throughput", "output_throughput", "ttft_p99_ms", "itl_p99_ms", "failed")}})
    return pd.DataFrame(rows)


def seed_estimate(requests_per_second: float = 10, avg_prompt_tokens: float = 2000, avg_output_tokens: float = 300,
                  cache_hit_rate: float = 0.7, prefill_ms_per_1k_tokens: float = 50,
                  decode_ms_per_token: float = 150, headroom: float = 1.2) -> dict[str, float]:
    """The seed's planning model, step by step, with its defaults (its worked example). ``code_result`` is what
    its code returns (it rounds to the nearest integer); ``text_result`` what its prose prints (after rounding
    requests/s per GPU to 0.022 first, then rounding up); ``ceil_result`` the exact value rounded up."""
    prefill_ms = avg_prompt_tokens * (1 - cache_hit_rate) / 1000 * prefill_ms_per_1k_tokens
    total_ms = prefill_ms + avg_output_tokens * decode_ms_per_token
    rps_per_gpu = 1000 / total_ms
    exact = requests_per_second / rps_per_gpu * headroom
    return {"prefill_ms": prefill_ms, "total_ms_per_request": total_ms, "rps_per_gpu": rps_per_gpu,
            "exact_gpus": exact, "code_result": max(1, int(exact + 0.5)), "ceil_result": math.ceil(exact),
            "text_result": math.ceil(requests_per_second / round(rps_per_gpu, 3) * headroom)}


def prefill_floor_ms(spec: ModelSpec, tokens: int, peak_flops: float, dtype: torch.dtype = torch.bfloat16) -> float:
    """The least time a ``tokens``-token prefill of ``spec`` takes on a device doing ``peak_flops`` FLOP/s:
    its FLOPs (`workbench.roofline.counts`) over the peak, i.e. at 100 % utilization."""
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be > 0, got {peak_flops!r}")
    return count_step(spec, prefill_work(tokens), dtype=dtype).flops / peak_flops * 1000
