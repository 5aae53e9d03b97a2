"""Chapter 8's panels: a live serving dashboard over scraped /metrics, the engine's step profiled by named range,
and capacity planning from the engine's own measured step costs.

The dashboard drives load at a server by URL (ours, started by `workbench.lab.ch08_monitoring.serve`, or any
vLLM-compatible endpoint) and scrapes its /metrics meanwhile; while the load runs it redraws its figure about
once a second, so a reader with a live kernel watches the quantities move. The stored notebook keeps the last
state.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time
from pathlib import Path

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.bench.runner import run_benchmark
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.lab.kit.figures import style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.lab.kit.panel import current_execution as _current_execution
from workbench.monitoring.alerts import ChangeAlert
from workbench.monitoring.capacity import StepCostModel, TrafficProfile, plan_from_step_costs
from workbench.monitoring.dashboard import long_prompt_burst, panel_frame, steady_load
from workbench.monitoring.profiling import profile_steps
from workbench.monitoring.scrape import MetricsScraper

WINDOW_S = 2.0
# p99 TTFT against the median of its own 3 s baseline ending one window back, held 2.5 s (the rule the
# monitoring tests check fires on a burst and stays quiet on steady load: tests/test_monitoring_live.py).
RULE = ChangeAlert("p99 TTFT doubled", factor=2.0, baseline_s=3.0, gap_s=2.0, hold_s=2.5)
BURST_AT_S = 5.0
FAULTS = ("long-prompt burst", "none (steady load)")
# (row, col) of each series in the dashboard's 2 x 3 grid
GRID = {"ttft_p50_s": (1, 1), "ttft_p99_s": (1, 1), "itl_p50_s": (1, 2), "itl_p99_s": (1, 2), "running": (1, 3),
        "waiting": (1, 3), "kv_usage": (2, 1), "prefix_hit_rate": (2, 1), "generation_tokens_per_s": (2, 2),
        "preemptions_per_s": (2, 3)}


def dashboard_load(fault: str, *, steady: int = 60, rate: float = 6.0, burst: int = 8,
                   burst_tokens: int = 1500) -> list:
    """Steady short requests, then (the fault) a burst of long prompts at ``BURST_AT_S`` seconds."""
    load = steady_load(steady, rate)
    return load + (long_prompt_burst(burst, burst_tokens, at_s=BURST_AT_S) if fault == FAULTS[0] else [])


class DashboardLab(LabPanel):
    """The serving dashboard: TTFT/ITL p50/p99, running/waiting, KV usage, prefix hit rate, tokens/s, preemptions,
    and the p99-TTFT change alert, while a load (with or without an injected fault) runs against ``url``."""

    def __init__(self, url: str, subtitle: str, *, fault: str = FAULTS[0], interval_s: float = 0.25):
        self.url, self.subtitle, self.interval_s = url, subtitle, interval_s
        self.fault = widgets.Dropdown(options=list(FAULTS), value=fault, description="fault")
        self.rate = widgets.FloatSlider(value=6.0, min=2.0, max=12.0, step=1.0, description="steady req/s")
        super().__init__([self.fault, self.rate], [go.Figure(), go.Figure()])
        self.refresh()

    def measure(self) -> None:
        load = dashboard_load(self.fault.value, rate=self.rate.value)
        load.sort(key=lambda r: r.arrival_s)
        result: dict = {}
        with MetricsScraper(self.url, interval_s=self.interval_s) as scraper:
            scraper.scrape_once()
            self.started_at = time.time()
            runner = threading.Thread(target=lambda: result.update(
                bench=run_benchmark(self.url, load, progress=False)), daemon=True)
            runner.start()
            while runner.is_alive():
                runner.join(1.0)
                self.progress(int(time.time() - self.started_at), int(load[-1].arrival_s) + 3,
                              f"{time.time() - self.started_at:.0f} s of load")
                self._live(scraper.frame())
            time.sleep(0.5)
            scraper.scrape_once()
        if "bench" not in result:
            raise RuntimeError("the load run failed (see the server's log)")
        self.bench = result["bench"]
        self.samples = scraper.frame()
        self.panels = panel_frame(self.samples, WINDOW_S)
        self.alert = RULE.evaluate(self.panels["ttft_p99_s"])
        # the burst's arrival on the panels' clock (seconds from the first scrape)
        self.burst_t = BURST_AT_S + self.started_at - self.samples["time"].min()
        self.progress.finish(f"{len(load)} requests, {self.samples['time'].nunique()} scrapes")

    def _live(self, samples: pd.DataFrame) -> None:
        """Redraw while the load runs, but only where the panel's outputs can be updated in place."""
        if not self._handles or samples["time"].nunique() < 3:
            return
        execution = _current_execution()
        if execution is not None and execution != self._shown_in:
            return
        self.panels, self.alert, self.burst_t = panel_frame(samples, WINDOW_S), None, None
        self.redraw()

    def draw(self) -> None:
        p = self.panels
        fig = make_subplots(rows=2, cols=3, subplot_titles=(
            "TTFT p50 / p99 (s)", "ITL p50 / p99 (s)", "running / waiting", "KV usage, prefix hit rate",
            "generated tokens/s", "preemptions/s"), vertical_spacing=0.16)
        for name, (row, col) in GRID.items():
            fig.add_trace(go.Scatter(x=p.index, y=p[name], name=name, mode="lines"), row=row, col=col)
        self.figures[0] = style(fig, f"Serving dashboard ({self.fault.value}, {WINDOW_S:.0f} s windows)",
                                self.subtitle, height=560)
        alert = go.Figure()
        alert.add_trace(go.Scatter(x=p.index, y=p["ttft_p99_s"], name="p99 TTFT (s)"))
        if self.alert is not None:
            t = self.alert.table
            alert.add_trace(go.Scatter(x=t["time"], y=RULE.factor * t["baseline"], name="2 x baseline",
                                       line={"dash": "dot"}))
            firing = t[t["firing"]]
            alert.add_trace(go.Scatter(x=firing["time"], y=firing["value"], name="firing", mode="markers",
                                       marker={"color": "#d62728", "size": 9}))
        if self.burst_t is not None and self.fault.value == FAULTS[0]:
            alert.add_vline(x=self.burst_t, line_dash="dash", annotation_text="burst arrives")
        alert.update_xaxes(title="seconds from the first scrape")
        self.figures[1] = style(alert, f"Alert rule: {RULE.name} (baseline {RULE.baseline_s:.0f} s ending "
                                f"{RULE.gap_s:.0f} s back, held {RULE.hold_s} s)", self.subtitle, height=380)
        if self.alert is None:
            self.status.value = "<i>load running…</i>"
        else:
            fired = (f"fired at {self.alert.fired_at:.2f} s" if self.alert.fired else "did not fire")
            self.status.value = (f"<b>{self.fault.value}</b>: peak waiting {p['waiting'].max():.0f}, peak KV usage "
                                 f"{p['kv_usage'].max():.0%}, p99 TTFT up to {p['ttft_p99_s'].max():.2f} s; "
                                 f"the alert {fired}")


def planning_prompts(n: int, seed: int = 3, vocab: int = 49152) -> list[tuple[list[int], int]]:
    """``n`` requests with prompts of 16-320 tokens and 4-24 output tokens (seeded): mixed steps to fit on."""
    rng = random.Random(seed)
    return [([rng.randrange(1000, vocab) for _ in range(rng.randrange(16, 320))], rng.randrange(4, 24))
            for _ in range(n)]


def planning_engine(model, tokenizer, *, num_blocks: int = 256) -> LLMEngine:
    return LLMEngine(model, tokenizer, cache_config=CacheConfig(num_blocks=num_blocks),
                     scheduler_config=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8))


def load_engine(engine: LLMEngine, requests: list[tuple[list[int], int]]) -> LLMEngine:
    for prompt, out in requests:
        engine.add_request(prompt, SamplingParams(max_tokens=out, ignore_eos=True), chat=False)
    return engine


class ProfileLab(LabPanel):
    """``profile_steps`` on the real model: exclusive time per named range of the step and per operator, and a
    Chrome trace (open it in https://ui.perfetto.dev)."""

    def __init__(self, model, tokenizer, *, steps: int = 6, trace_path: str | Path | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.trace_path = Path(trace_path or Path(tempfile.gettempdir()) / "kv_workbench_ch08_step_trace.json")
        self.steps = widgets.IntSlider(value=steps, min=2, max=40, description="steps")
        self.requests = widgets.IntSlider(value=6, min=1, max=8, description="requests")
        super().__init__([self.steps, self.requests], [go.Figure()])
        self.refresh()

    def measure(self) -> None:
        # Kineto (the profiler's backend) prints a line to stderr at every start and stop, which a notebook shows
        # as an error stream; level 6 silences it. Read when the profiler first starts; a value already set wins.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        engine = load_engine(planning_engine(self.model, self.tokenizer), planning_prompts(self.requests.value))
        self.profile = profile_steps(engine, self.steps.value, trace_path=self.trace_path)

    def draw(self) -> None:
        r = self.profile.ranges
        fig = go.Figure(go.Bar(x=r["range"], y=r["ms_per_step"], text=[f"{s:.0%}" for s in r["share"]]))
        fig.update_yaxes(title="ms per step (exclusive)")
        per_step = self.profile.step_ms / self.profile.num_steps
        self.figures[0] = style(fig, f"Where a step's time goes ({self.profile.num_steps} steps, {per_step:.1f} ms "
                                "each)", measured_on(self.model))
        self.status.value = (f"the ranges cover {self.profile.coverage:.0%} of the measured step time; trace: "
                             f"<code>{self.profile.trace_path}</code>")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [("time per range", self.profile.ranges.round(3)),
                ("top operators by self CPU time", self.profile.operators.head(10).round(3))]


class CapacityLab(LabPanel):
    """Fit ``fixed + per prefill token + per decoding sequence`` to the real model's steps, then size a
    deployment for a traffic profile with ``plan_from_step_costs``."""

    def __init__(self, model, tokenizer, *, requests: int = 12):
        self.model, self.tokenizer, self.num_requests = model, tokenizer, requests
        self.rate = widgets.FloatSlider(value=5.0, min=0.5, max=50.0, step=0.5, description="req/s")
        self.itl_slo = widgets.IntSlider(value=250, min=20, max=1000, step=10, description="ITL SLO ms")
        super().__init__([], [go.Figure()], redraw_only=[self.rate, self.itl_slo])
        self.refresh()

    def measure(self) -> None:
        engine = load_engine(planning_engine(self.model, self.tokenizer), planning_prompts(self.num_requests, seed=7))
        while engine.has_unfinished_requests():
            engine.step()
        self.steps = engine.metrics.step_frame()
        self.costs = StepCostModel.fit(self.steps)
        self.kv_tokens = engine.blocks.num_blocks * engine.cache_config.block_size

    def traffic(self) -> TrafficProfile:
        prompts = [len(p) for p, _ in planning_prompts(self.num_requests, seed=7)]
        outputs = [o for _, o in planning_prompts(self.num_requests, seed=7)]
        return TrafficProfile(self.rate.value, prompts, outputs, ttft_slo_s=2.0, itl_slo_s=self.itl_slo.value / 1000)

    def draw(self) -> None:
        s, c = self.steps, self.costs
        predicted = [c.step_ms(a, b) for a, b in zip(s["num_prefill_tokens"], s["num_decode_seqs"], strict=True)]
        fig = go.Figure(go.Scatter(x=predicted, y=s["duration_s"] * 1000, mode="markers", name="steps",
                                   text=[f"{a} prefill tokens, {b} decodes" for a, b in
                                         zip(s["num_prefill_tokens"], s["num_decode_seqs"], strict=True)]))
        top = max(max(predicted), float(s["duration_s"].max() * 1000))
        fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="measured = fitted",
                                 line={"dash": "dot"}))
        fig.update_xaxes(title="fitted step ms").update_yaxes(title="measured step ms")
        self.figures[0] = style(fig, f"Step cost: {c.fixed_ms:.1f} ms + {c.prefill_ms_per_token:.3f} ms/prefill "
                                f"token + {c.decode_ms_per_seq:.2f} ms/decode (R² {c.r2:.2f})", measured_on(self.model))
        self.plan = plan_from_step_costs(self.traffic(), c, kv_capacity_tokens=self.kv_tokens)
        chosen = self.plan[self.plan["chosen"]]
        self.status.value = ("no batch size meets the ITL SLO" if chosen.empty else
                             f"{self.rate.value:g} req/s at ITL ≤ {self.itl_slo.value} ms: batch "
                             f"{int(chosen['batch'].iloc[0])}, {chosen['rps_per_replica'].iloc[0]:.2f} req/s per "
                             f"replica, <b>{chosen['replicas'].iloc[0]} replicas</b>")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [("plan per decode batch size", self.plan.round(3))]
