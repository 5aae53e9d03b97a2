"""Chapter 5's panels: each runs the engine through `workbench.lab.ch05_runs` / `ch05_claims` and draws it.

Every panel builds its engines over one already loaded model (an engine costs only its KV pool), so a panel can
compare batching modes or policies side by side in one run.
"""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.bench.drive import MODES, batching_engine, drive
from workbench.lab.ch05_claims import priority_run, with_priorities
from workbench.lab.ch05_runs import (
    capacity_run,
    concurrency_sweep,
    knee,
    random_requests,
    variance_effect,
)
from workbench.lab.kit.figures import style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel

COLORS = {"static": "#d62728", "dynamic": "#ff7f0e", "continuous": "#1f77b4"}


class _EnginePanel(LabPanel):
    def __init__(self, model, tokenizer, controls, figures, **kwargs):
        self.model, self.tokenizer = model, tokenizer
        self.vocab_size = model.spec.vocab_size
        self.subtitle = measured_on(model)
        super().__init__(controls, figures, **kwargs)

    def engine(self, mode: str, **options):
        return batching_engine(self.model, self.tokenizer, mode, **options)


class ModesLab(_EnginePanel):
    """The three batching modes on one mixed workload, closed loop: who waits and who runs, request by request."""

    def __init__(self, model, tokenizer, *, requests: int = 8, users: int = 4, max_num_seqs: int = 4):
        self.requests, self.max_num_seqs = requests, max_num_seqs
        self.users = widgets.IntSlider(value=users, min=1, max=10, description="users")
        self.show = widgets.Dropdown(options=list(MODES), value="static", description="timeline")
        super().__init__(model, tokenizer, [self.users], [go.Figure(), go.Figure()], redraw_only=[self.show])
        self.refresh()

    def measure(self) -> None:
        workload = random_requests(self.requests, output_tokens=(4, 16), seed=5, vocab_size=self.vocab_size)
        self.runs = {}
        for i, mode in enumerate(MODES):
            self.progress(i, len(MODES), mode)
            self.runs[mode] = drive(self.engine(mode, max_num_seqs=self.max_num_seqs, dynamic_batch_size=3),
                                    workload, concurrency=self.users.value)
        self.table = pd.DataFrame([{"mode": m, "output_tok_s": r.summary["output_throughput"],
                                    "ttft_p50_ms": r.summary["ttft_median_ms"], "e2e_p99_ms": r.summary["e2e_p99_ms"]}
                                   for m, r in self.runs.items()]).set_index("mode")
        self.progress.finish("done")

    def draw(self) -> None:
        rows = self.runs[self.show.value].requests
        t0 = rows["arrival"].min()
        timeline, bars = self.figures
        with timeline.batch_update():
            timeline.data = []
            for name, start, end, color in (("queued", "arrival", "first_scheduled", "#bbbbbb"),
                                            ("running", "first_scheduled", "finish", COLORS[self.show.value])):
                timeline.add_bar(name=name, y=rows["workload_index"], x=rows[end] - rows[start],
                                 base=rows[start] - t0, orientation="h", marker_color=color)
            timeline.update_layout(barmode="overlay", xaxis_title="seconds since the first request",
                                   yaxis_title="request", yaxis_autorange="reversed")
            style(timeline, f"Who waits and who runs: {self.show.value} batching, {self.users.value} users",
                  self.subtitle)
        with bars.batch_update():
            bars.data = []
            bars.add_bar(x=list(self.table.index), y=self.table["output_tok_s"], name="output tokens/s",
                         marker_color=[COLORS[m] for m in self.table.index])
            bars.update_layout(yaxis_title="output tokens/s")
            style(bars, "Throughput of the three modes on the same requests", self.subtitle, height=340)
        t = self.table
        self.status.value = (f"{self.users.value} users, {self.requests} requests: continuous "
                             f"{t.loc['continuous', 'output_tok_s']:.1f} tok/s, dynamic "
                             f"{t.loc['dynamic', 'output_tok_s']:.1f}, static {t.loc['static', 'output_tok_s']:.1f} "
                             f"({t.loc['continuous', 'output_tok_s'] / t.loc['static', 'output_tok_s']:.2f}x).")

    def stored_tables(self):
        return [("per mode (ms)", self.table.round(1))]


class SweepLab(_EnginePanel):
    """Throughput and latency against concurrency for each mode: the frontier, its knee, goodput under an SLO."""

    # 12 requests: more than the largest default concurrency, so 8 users is still a closed loop, not one burst.
    def __init__(self, model, tokenizer, *, requests: int = 12, concurrencies: tuple[int, ...] = (2, 4, 8)):
        self.workload = random_requests(requests, output_tokens=(4, 16), seed=1, vocab_size=model.spec.vocab_size)
        options = {"2, 4, 8 users (~30 s on 2 cores)": (2, 4, 8), "1, 2, 4, 8, 16 users (~90 s)": (1, 2, 4, 8, 16)}
        if concurrencies not in options.values():
            options[", ".join(map(str, concurrencies)) + " users"] = concurrencies
        self.levels = widgets.Dropdown(options=options, value=concurrencies, description="sweep")
        self.ttft_slo = widgets.IntSlider(value=1500, min=100, max=5000, step=100, description="TTFT SLO ms")
        self.share = 0.9
        super().__init__(model, tokenizer, [self.levels], [go.Figure(), go.Figure()], redraw_only=[self.ttft_slo])
        self.refresh()

    def measure(self) -> None:
        def target(mode: str):
            return self.engine(mode, max_num_seqs=16, dynamic_batch_size=4)

        self.sweep = concurrency_sweep(target, self.workload, MODES, self.levels.value, progress=self.progress)

    @property
    def slo(self) -> dict[str, float]:
        return {"ttft": float(self.ttft_slo.value)}

    def good_share(self) -> pd.Series:
        """Share of requests within the TTFT SLO, per sweep row, from the per-request TTFTs the sweep kept."""
        return self.sweep["ttft_ms_all"].map(lambda v: float(np.mean(np.asarray(v) <= self.ttft_slo.value)))

    def knees(self) -> pd.DataFrame:
        return pd.DataFrame([knee(self.sweep[self.sweep["mode"] == m]) for m in MODES]).set_index("mode")

    def goodput_users(self) -> dict[str, float]:
        good = self.sweep.assign(good=self.good_share())
        return {m: float(g[g["good"] >= self.share]["concurrency"].max()) if (g["good"] >= self.share).any()
                else float("nan") for m, g in good.groupby("mode")}

    def draw(self) -> None:
        curve, frontier = self.figures
        with curve.batch_update():
            curve.data = []
            for mode in MODES:
                rows = self.sweep[self.sweep["mode"] == mode]
                curve.add_scatter(x=rows["concurrency"], y=rows["output_tok_s"], name=mode, mode="lines+markers",
                                  line_color=COLORS[mode])
            curve.update_layout(xaxis_title="concurrent users (closed loop)", yaxis_title="output tokens/s")
            style(curve, "Throughput against concurrency", self.subtitle, height=360)
        with frontier.batch_update():
            frontier.data = []
            for mode in MODES:
                rows = self.sweep[self.sweep["mode"] == mode]
                for stat, dash in (("p50", "dot"), ("p99", "solid")):
                    frontier.add_scatter(x=rows["output_tok_s"], y=rows[f"ttft_{stat}_ms"], name=f"{mode} {stat}",
                                         mode="lines+markers", line={"color": COLORS[mode], "dash": dash},
                                         text=[f"{c} users" for c in rows["concurrency"]])
            knees = self.knees()
            frontier.add_scatter(x=knees["output_tok_s"], y=knees["ttft_p99_ms"], mode="markers", name="knee",
                                 marker={"symbol": "star", "size": 16, "color": "black"})
            span = [self.sweep["output_tok_s"].min(), self.sweep["output_tok_s"].max()]
            frontier.add_scatter(x=span, y=[self.ttft_slo.value] * 2, mode="lines", name="TTFT SLO",
                                 line={"color": "gray", "dash": "dash"})
            frontier.update_layout(xaxis_title="output tokens/s", yaxis_title="TTFT (ms)", yaxis_type="log")
            style(frontier, "The throughput-latency frontier (TTFT p50 and p99)", self.subtitle)
        k, good = self.knees(), self.goodput_users()
        self.status.value = (f"Continuous batching's knee is at {int(k.loc['continuous', 'concurrency'])} users "
                             f"({k.loc['continuous', 'output_tok_s']:.1f} tok/s, p99 TTFT "
                             f"{k.loc['continuous', 'ttft_p99_ms']:.0f} ms); with {self.share:.0%} of requests "
                             f"inside a {self.ttft_slo.value} ms TTFT SLO the most users served is "
                             + ", ".join(f"{m} {good[m]:g}" for m in MODES) + ".")

    def stored_tables(self):
        cols = ["mode", "concurrency", "output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "e2e_p99_ms"]
        return [("closed-loop sweep (ms)", self.sweep[cols].round(1))]


class VarianceLab(_EnginePanel):
    """Static vs continuous batching as output lengths spread out (same range, same users)."""

    # 16 requests: with 8 the last long request runs alone in both modes and hides most of static's padding.
    def __init__(self, model, tokenizer, *, requests: int = 16, users: int = 4):
        self.requests = requests
        self.users = widgets.IntSlider(value=users, min=2, max=12, description="users")
        super().__init__(model, tokenizer, [self.users], [go.Figure()])
        self.refresh()

    def measure(self) -> None:
        self.table = variance_effect(lambda mode: self.engine(mode, max_num_seqs=12), self.requests, (2, 24),
                                     users=self.users.value, vocab_size=self.vocab_size, progress=self.progress)

    def ratios(self) -> pd.Series:
        wide = self.table.pivot(index="spread", columns="mode", values="output_tok_s")
        return (wide["continuous"] / wide["static"]).reindex(["fixed", "uniform", "log-uniform"])

    def step_ratios(self) -> pd.Series:
        """Static's engine steps over continuous's, per spread: the clock-free version of ``ratios``."""
        wide = self.table.pivot(index="spread", columns="mode", values="steps")
        return (wide["static"] / wide["continuous"]).reindex(["fixed", "uniform", "log-uniform"])

    def draw(self) -> None:
        fig = self.figures[0]
        with fig.batch_update():
            fig.data = []
            for mode in ("static", "continuous"):
                rows = self.table[self.table["mode"] == mode]
                fig.add_bar(x=[f"{s} (cv {cv:.2f})" for s, cv in zip(rows["spread"], rows["output_cv"], strict=True)],
                            y=rows["output_tok_s"], name=mode, marker_color=COLORS[mode])
            fig.update_layout(barmode="group", xaxis_title="output lengths (coefficient of variation)",
                              yaxis_title="output tokens/s")
            style(fig, "Output-length variance: static vs continuous batching", self.subtitle, height=380)
        r = self.ratios()
        self.status.value = (f"continuous / static throughput: {r['fixed']:.2f}x with equal output lengths, "
                             f"{r['uniform']:.2f}x uniform, {r['log-uniform']:.2f}x log-uniform.")

    def stored_tables(self):
        return [("variance runs", self.table[["spread", "mode", "output_cv", "steps", "output_tok_s",
                                              "e2e_p99_ms"]].round(2))]


class CapacityLab(_EnginePanel):
    """``max_num_seqs`` against the KV pool: how many sequences really run together as the pool shrinks."""

    def __init__(self, model, tokenizer, *, requests: int = 4, pools: tuple[int, ...] = (2, 4, 8)):
        self.workload = random_requests(requests, prompt_tokens=24, output_tokens=(8, 8), seed=3, spread="fixed",
                                        vocab_size=model.spec.vocab_size)
        self.max_seqs = widgets.IntSlider(value=4, min=2, max=16, description="max_num_seqs")
        self.pools = pools
        super().__init__(model, tokenizer, [self.max_seqs], [go.Figure()])
        self.refresh()

    def measure(self) -> None:
        self.table = capacity_run(lambda n: self.engine("continuous", max_num_seqs=self.max_seqs.value, num_blocks=n),
                                  self.workload, self.pools, progress=self.progress)

    def draw(self) -> None:
        fig, t = self.figures[0], self.table
        with fig.batch_update():
            fig.data = []
            fig.add_scatter(x=t["num_blocks"], y=t["bound"], name="min(max_num_seqs, blocks / blocks per sequence)",
                            mode="lines", line_dash="dash")
            fig.add_scatter(x=t["num_blocks"], y=t["peak_batch"], name="largest batch measured", mode="markers",
                            marker_size=12)
            fig.update_layout(xaxis_title="KV blocks in the pool (16 tokens each)", yaxis_title="sequences per step")
            style(fig, "The KV pool bounds the batch, not max_num_seqs alone", self.subtitle, height=380)
        # Rows of a mixed int/float frame come back as floats: counts are printed as integers.
        small, large = t.iloc[0].map(int), t.iloc[-1].map(int)
        self.status.value = (f"With {small['num_blocks']} blocks and {small['blocks_per_seq']} blocks per sequence "
                             f"the batch peaked at {small['peak_batch']} although max_num_seqs is "
                             f"{small['max_num_seqs']}; with {large['num_blocks']} blocks it reached "
                             f"{large['peak_batch']}.")

    def stored_tables(self):
        return [("capacity runs", self.table.round(2))]


class PriorityLab(_EnginePanel):
    """Overload with interactive (priority 0) and batch (priority 1) requests: FCFS against priority scheduling."""

    def __init__(self, model, tokenizer, *, requests: int = 9, max_num_seqs: int = 3, num_blocks: int = 7):
        self.workload = with_priorities(random_requests(requests, prompt_tokens=24, output_tokens=(4, 16), seed=4,
                                                        vocab_size=model.spec.vocab_size))
        self.rate = widgets.Dropdown(options={"all at once": None, "8 req/s Poisson": 8.0}, value=None,
                                     description="arrivals")
        self.limits = {"max_num_seqs": max_num_seqs, "num_blocks": num_blocks}
        super().__init__(model, tokenizer, [self.rate], [go.Figure()])
        self.refresh()

    def measure(self) -> None:
        self.table = priority_run(lambda policy: self.engine("continuous", scheduling_policy=policy, **self.limits),
                                  self.workload, rate=self.rate.value)

    def cell(self, policy: str, cls: str, column: str) -> float:
        t = self.table
        return float(t[(t["policy"] == policy) & (t["class"] == cls)][column].iloc[0])

    def draw(self) -> None:
        fig = self.figures[0]
        with fig.batch_update():
            fig.data = []
            for cls, color in (("interactive", "#2ca02c"), ("batch", "#7f7f7f")):
                rows = self.table[self.table["class"] == cls]
                fig.add_bar(x=rows["policy"], y=rows["ttft_p50_ms"], name=f"{cls} TTFT p50", marker_color=color)
            fig.update_layout(barmode="group", yaxis_title="TTFT p50 (ms)")
            style(fig, "Priorities under overload: interactive vs batch requests", self.subtitle, height=380)
        self.status.value = (f"Interactive TTFT p50: FCFS {self.cell('fcfs', 'interactive', 'ttft_p50_ms'):.0f} ms, "
                             f"priority {self.cell('priority', 'interactive', 'ttft_p50_ms'):.0f} ms; batch requests "
                             f"{self.cell('fcfs', 'batch', 'ttft_p50_ms'):.0f} -> "
                             f"{self.cell('priority', 'batch', 'ttft_p50_ms'):.0f} ms, preempted "
                             f"{self.cell('priority', 'batch', 'preemptions'):.0f} times under priority.")

    def stored_tables(self):
        return [("by policy and class", self.table.round(1))]

