"""Chapter 8's measurements as result objects: what the panels draw, the prose reads and the closing table judges.

- `run_dashboard` → `DashboardRun`: a load (steady, or with a long-prompt burst) against a server while its
  /metrics is scraped; the Grafana-style panel series, the change alert on p99 TTFT, the benchmark's records;
- `capacity_fit` → `CapacityFit`: every step of a mixed run of the real model, the fitted step cost
  (``fixed + per prefill token + per decoding sequence``) and the deployment plans it gives;
- `seed_planning`, `prefill_check`: the book's planning arithmetic recomputed (no model).

ITL against TPOT and the chapter's baseline costs are in `workbench.lab.ch08.latency`. No widgets here.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from workbench.bench.runner import ServingBenchResult, run_benchmark
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.models import model_spec
from workbench.monitoring.alerts import AlertResult, ChangeAlert
from workbench.monitoring.capacity import (
    StepCostModel,
    TrafficProfile,
    plan_from_step_costs,
    prefill_floor_ms,
    seed_estimate,
)
from workbench.monitoring.dashboard import long_prompt_burst, panel_frame, steady_load
from workbench.monitoring.scrape import MetricsScraper
from workbench.progress import ProgressFn, no_progress

A100_BF16_PEAK = 312e12  # dense bf16 FLOP/s of an A100 (NVIDIA's datasheet)
WINDOW_S = 2.0
# p99 TTFT against the median of its own 3 s baseline ending one window back, held 2.5 s (the rule the
# monitoring tests check fires on a burst and stays quiet on steady load: tests/monitoring/test_monitoring_live.py).
RULE = ChangeAlert("p99 TTFT doubled", factor=2.0, baseline_s=3.0, gap_s=2.0, hold_s=2.5)
BURST_AT_S = 5.0
FAULTS = ("long-prompt burst", "none (steady load)")


# ------------------------------------------------------------------------------------------- dashboard
def dashboard_load(fault: str, *, steady: int = 60, rate: float = 6.0, burst: int = 16,
                   burst_tokens: int = 1500) -> list:
    """Steady short requests, then (the fault) a burst of long prompts at ``BURST_AT_S`` seconds."""
    load = steady_load(steady, rate)
    return load + (long_prompt_burst(burst, burst_tokens, at_s=BURST_AT_S) if fault == FAULTS[0] else [])


@dataclass(frozen=True)
class DashboardRun:
    """One load against a server: the scrapes, the dashboard's series (2 s windows), the alert's evaluation and
    the benchmark client's per-request records (``bench.requests``, ``bench.itl``)."""

    fault: str
    bench: ServingBenchResult
    samples: pd.DataFrame
    panels: pd.DataFrame
    alert: AlertResult
    burst_t: float  # the burst's arrival on the panels' clock (seconds from the first scrape)

    @property
    def has_burst(self) -> bool:
        return self.fault == FAULTS[0]

    @property
    def fired_on_burst(self) -> bool:
        return self.alert.fired and self.alert.fired_at >= self.burst_t

    @property
    def peak_waiting(self) -> float:
        return float(self.panels["waiting"].max())

    @property
    def peak_kv_usage(self) -> float:
        return float(self.panels["kv_usage"].max())

    @property
    def peak_ttft_p99_s(self) -> float:
        return float(self.panels["ttft_p99_s"].max())

    @property
    def completed(self) -> int:
        return int(self.bench.summary["completed"])

    @property
    def failed(self) -> int:
        return int(self.bench.summary["failed"])


def run_dashboard(url: str, fault: str = FAULTS[0], *, rate: float = 6.0, interval_s: float = 0.25,
                  progress: ProgressFn = no_progress,
                  on_samples: Callable[[pd.DataFrame], None] | None = None) -> DashboardRun:
    """Drive ``dashboard_load(fault)`` at ``url`` with the benchmark client while scraping its /metrics every
    ``interval_s``; ``on_samples`` gets the scrapes so far about once a second (a live redraw)."""
    load = sorted(dashboard_load(fault, rate=rate), key=lambda r: r.arrival_s)
    result: dict = {}
    with MetricsScraper(url, interval_s=interval_s) as scraper:
        scraper.scrape_once()
        started_at = time.time()
        runner = threading.Thread(target=lambda: result.update(bench=run_benchmark(url, load, progress=False)),
                                  daemon=True)
        runner.start()
        while runner.is_alive():
            runner.join(1.0)
            progress(int(time.time() - started_at), int(load[-1].arrival_s) + 3,
                     f"{time.time() - started_at:.0f} s of load")
            if on_samples is not None:
                on_samples(scraper.frame())
        time.sleep(0.5)
        scraper.scrape_once()
    if "bench" not in result:
        raise RuntimeError("the load run failed (see the server's log)")
    samples = scraper.frame()
    panels = panel_frame(samples, WINDOW_S)
    return DashboardRun(fault, result["bench"], samples, panels, RULE.evaluate(panels["ttft_p99_s"]),
                        BURST_AT_S + started_at - samples["time"].min())


# -------------------------------------------------------------------------------------- capacity plan
def planning_prompts(n: int, seed: int = 3, vocab: int = 49152) -> list[tuple[list[int], int]]:
    """``n`` requests with prompts of 16-320 tokens and 4-24 output tokens (seeded): mixed steps to fit on."""
    rng = random.Random(seed)
    return [([rng.randrange(1000, vocab) for _ in range(rng.randrange(16, 320))], rng.randrange(4, 24))
            for _ in range(n)]


PLANNING_BUDGET = 256  # tokens per step (max_num_batched_tokens) of the planning engine: prefill chunks <= this


def planning_engine(model, tokenizer, *, num_blocks: int = 256) -> LLMEngine:
    return LLMEngine(model, tokenizer, cache_config=CacheConfig(num_blocks=num_blocks),
                     scheduler_config=SchedulerConfig(max_num_batched_tokens=PLANNING_BUDGET, max_num_seqs=8))


def load_engine(engine: LLMEngine, requests: list[tuple[list[int], int]]) -> LLMEngine:
    for prompt, out in requests:
        engine.add_request(prompt, SamplingParams(max_tokens=out, ignore_eos=True), chat=False)
    return engine


@dataclass(frozen=True)
class CapacityFit:
    """The steps of a mixed run (prefill chunks of at most ``PLANNING_BUDGET`` tokens beside decodes), the cost
    fitted to them, the KV capacity, and the run's own request lengths as the traffic to plan for."""

    steps: pd.DataFrame
    costs: StepCostModel
    kv_tokens: int
    prompts: list[int]
    outputs: list[int]

    def traffic(self, rate: float, itl_slo_ms: float) -> TrafficProfile:
        return TrafficProfile(rate, self.prompts, self.outputs, ttft_slo_s=2.0, itl_slo_s=itl_slo_ms / 1000)

    def plan(self, rate: float, itl_slo_ms: float, stat: str = "mean") -> pd.DataFrame:
        return plan_from_step_costs(self.traffic(rate, itl_slo_ms), self.costs, kv_capacity_tokens=self.kv_tokens,
                                    stat=stat)

    def replicas(self, rate: float, itl_slo_ms: float, stat: str = "mean") -> float:
        """The chosen batch's replica count (inf: no batch size meets the ITL target)."""
        plan = self.plan(rate, itl_slo_ms, stat)
        chosen = plan.loc[plan["chosen"], "replicas"]
        return float(chosen.iloc[0]) if len(chosen) else float("inf")

    def predicted_ms(self) -> list[float]:
        return [self.costs.step_ms(a, b) for a, b in
                zip(self.steps["num_prefill_tokens"], self.steps["num_decode_seqs"], strict=True)]

    @property
    def largest_chunk(self) -> int:
        return int(self.steps["num_prefill_tokens"].max())


def capacity_fit(model, tokenizer, *, requests: int = 12, seed: int = 7) -> CapacityFit:
    workload = planning_prompts(requests, seed=seed)
    engine = load_engine(planning_engine(model, tokenizer), workload)
    while engine.has_unfinished_requests():
        engine.step()
    steps = engine.metrics.step_frame()
    return CapacityFit(steps, StepCostModel.fit(steps), engine.blocks.num_blocks * engine.cache_config.block_size,
                       [len(p) for p, _ in workload], [o for _, o in workload])


# ------------------------------------------------------------------------------- the book's arithmetic
def seed_planning() -> pd.DataFrame:
    """The book's worked example (10 req/s, 2,000-token prompts at 70 % hits, 300 output tokens, 50 ms per 1k
    prefill tokens, 150 ms per decode token, 20 % headroom), step by step."""
    s = seed_estimate()
    rows = [("prefill ms per request", s["prefill_ms"]), ("ms per request (single stream)", s["total_ms_per_request"]),
            ("requests/s per GPU", s["rps_per_gpu"]), ("GPUs, exact", s["exact_gpus"]),
            ("its code returns (round to nearest)", s["code_result"]),
            ("its prose prints (rps rounded to 0.022 first)", s["text_result"]),
            ("rounded up, as sizing must", s["ceil_result"])]
    return pd.DataFrame(rows, columns=["step", "value"]).set_index("step")


def prefill_check(tokens: int = 1000) -> dict[str, float]:
    """Llama-3-70B's ``tokens``-token prefill at the A100's bf16 peak against the book's 50 ms."""
    floor = prefill_floor_ms(model_spec("llama-3-70b"), tokens, A100_BF16_PEAK)
    return {"floor_ms": floor, "seed_ms": 50.0, "seed_over_peak": floor / 50.0}
