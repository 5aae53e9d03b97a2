"""Chapter 8's step-level panels on the real model: ``ProfileLab`` (the engine's step profiled by named range)
and ``CapacityPlanLab`` (the step cost fitted to a mixed run, and the deployment it sizes)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.lab.ch08.runs import CapacityFit, capacity_fit, load_engine, planning_engine, planning_prompts
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.monitoring.profiling import StepProfile, profile_steps

RANGES = "ms per step (exclusive)"
STEPS, DIAGONAL = "steps", "measured = fitted"


class ProfileLab(LabPanel):
    """``profile_steps`` on the real model: exclusive time per named range of the step and per operator, and a
    Chrome trace (open it in https://ui.perfetto.dev). ``result`` is the `StepProfile`."""

    def __init__(self, model, tokenizer, *, steps: int = 6, trace_path: str | Path | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.trace_path = Path(trace_path or Path(tempfile.gettempdir()) / "kv_workbench_ch08_step_trace.json")
        self.steps = widgets.IntSlider(value=steps, min=2, max=40, description="steps")
        self.requests = widgets.IntSlider(value=6, min=1, max=8, description="requests")
        fig = go.Figure(go.Bar(name=RANGES))
        fig.update_yaxes(title=RANGES)
        super().__init__([self.steps, self.requests], [fig])

    def measure(self) -> StepProfile:
        # Kineto (the profiler's backend) prints a line to stderr at every start and stop, which a notebook shows
        # as an error stream; level 6 silences it. Read when the profiler first starts; a value already set wins.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        engine = load_engine(planning_engine(self.model, self.tokenizer), planning_prompts(self.requests.value))
        return profile_steps(engine, self.steps.value, trace_path=self.trace_path)

    def draw(self) -> None:
        profile: StepProfile = self.result
        r = profile.ranges
        fig = self.figures[0]
        set_trace(fig, RANGES, x=r["range"], y=r["ms_per_step"], text=[f"{s:.0%}" for s in r["share"]])
        per_step = profile.step_ms / profile.num_steps
        style(fig, f"Where a step's time goes ({profile.num_steps} steps, {per_step:.1f} ms each)",
              measured_on(self.model))
        self.status.value = (f"the ranges cover {profile.coverage:.0%} of the measured step time; trace: "
                             f"<code>{profile.trace_path}</code>")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [("time per range", self.result.ranges.round(3)),
                ("top operators by self CPU time", self.result.operators.head(10).round(3))]


class CapacityPlanLab(LabPanel):
    """Fit ``fixed + per prefill token + per decoding sequence`` to the real model's steps (`CapacityFit`), then
    size a deployment for the run's own traffic at a rate and ITL target (those two only redraw)."""

    def __init__(self, model, tokenizer, *, requests: int = 12):
        self.model, self.tokenizer, self.num_requests = model, tokenizer, requests
        self.rate = widgets.FloatSlider(value=5.0, min=0.5, max=50.0, step=0.5, description="req/s")
        self.itl_slo = widgets.IntSlider(value=250, min=20, max=1000, step=10, description="ITL SLO ms")
        fig = go.Figure()
        fig.add_scatter(name=STEPS, mode="markers")
        fig.add_scatter(name=DIAGONAL, mode="lines", line={"dash": "dot"})
        fig.update_xaxes(title="fitted step ms").update_yaxes(title="measured step ms")
        super().__init__([], [fig], redraw_only=[self.rate, self.itl_slo])

    def measure(self) -> CapacityFit:
        return capacity_fit(self.model, self.tokenizer, requests=self.num_requests)

    @property
    def plan(self) -> pd.DataFrame:
        return self.result.plan(self.rate.value, self.itl_slo.value)

    def draw(self) -> None:
        fit: CapacityFit = self.result
        s, c = fit.steps, fit.costs
        predicted = fit.predicted_ms()
        fig = self.figures[0]
        set_trace(fig, STEPS, x=predicted, y=s["duration_s"] * 1000,
                  text=[f"{a} prefill tokens, {b} decodes" for a, b in
                        zip(s["num_prefill_tokens"], s["num_decode_seqs"], strict=True)])
        top = max(max(predicted), float(s["duration_s"].max() * 1000))
        set_trace(fig, DIAGONAL, x=[0, top], y=[0, top])
        style(fig, f"Step cost: {c.fixed_ms:.1f} ms + {c.prefill_ms_per_token:.3f} ms/prefill token + "
                   f"{c.decode_ms_per_seq:.2f} ms/decode (R² {c.r2:.2f})", measured_on(self.model))
        chosen = self.plan[self.plan["chosen"]]
        self.status.value = ("no batch size meets the ITL SLO" if chosen.empty else
                             f"{self.rate.value:g} req/s at ITL ≤ {self.itl_slo.value} ms: batch "
                             f"{int(chosen['batch'].iloc[0])}, {chosen['rps_per_replica'].iloc[0]:.2f} req/s per "
                             f"replica, <b>{chosen['replicas'].iloc[0]} replicas</b>")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [("plan per decode batch size", self.plan.round(3))]
