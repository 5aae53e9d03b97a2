"""Chapter 5's panels on batching modes: the three modes side by side (`ModesLab`) and the concurrency sweep with
its frontier, knee and goodput (`ConcurrencySweepLab`). Each measures through `workbench.lab.ch05.runs` when
asked and draws the result object it gets back.

Every panel builds its engines over one already loaded model (an engine costs only its KV pool), so a panel can
compare batching modes or policies side by side in one run.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.bench.drive import MODES, batching_engine
from workbench.bench.synthetic import random_requests
from workbench.lab.ch05.runs import ConcurrencySweep, ModesRun, concurrency_sweep, modes_run
from workbench.lab.kit.figures import style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel

COLORS = {"static": "#d62728", "dynamic": "#ff7f0e", "continuous": "#1f77b4"}


class EnginePanel(LabPanel):
    """A panel over one loaded model; ``engine(mode, ...)`` builds a fresh engine of the chapter's shape."""

    def __init__(self, model, tokenizer, controls, figures, **kwargs):
        self.model, self.tokenizer = model, tokenizer
        self.vocab_size = model.spec.vocab_size
        self.subtitle = measured_on(model)
        super().__init__(controls, figures, **kwargs)

    def engine(self, mode: str, **options):
        return batching_engine(self.model, self.tokenizer, mode, **options)


class ModesLab(EnginePanel):
    """The three batching modes on one mixed workload, closed loop: who waits and who runs, request by request."""

    def __init__(self, model, tokenizer, *, requests: int = 8, users: int = 4, max_num_seqs: int = 4):
        self.requests, self.max_num_seqs = requests, max_num_seqs
        self.users = widgets.IntSlider(value=users, min=1, max=10, description="users")
        self.show = widgets.Dropdown(options=list(MODES), value="static", description="timeline")
        super().__init__(model, tokenizer, [self.users], [go.Figure(), go.Figure()], redraw_only=[self.show])

    def measure(self) -> ModesRun:
        workload = random_requests(self.requests, output_tokens=(4, 16), seed=5, vocab_size=self.vocab_size)
        return modes_run(lambda mode: self.engine(mode, max_num_seqs=self.max_num_seqs, dynamic_batch_size=3),
                         workload, users=self.users.value, progress=self.progress)

    def draw(self) -> None:
        result: ModesRun = self.result
        rows = result.runs[self.show.value].requests
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
            style(timeline, f"Who waits and who runs: {self.show.value} batching, {result.users} users",
                  self.subtitle)
        t = result.table
        with bars.batch_update():
            bars.data = []
            bars.add_bar(x=list(t.index), y=t["output_tok_s"], name="output tokens/s",
                         marker_color=[COLORS[m] for m in t.index])
            bars.update_layout(yaxis_title="output tokens/s")
            style(bars, "Throughput of the three modes on the same requests", self.subtitle, height=340)
        self.status.value = (f"{result.users} users, {self.requests} requests: continuous "
                             f"{t.loc['continuous', 'output_tok_s']:.1f} tok/s, dynamic "
                             f"{t.loc['dynamic', 'output_tok_s']:.1f}, static {t.loc['static', 'output_tok_s']:.1f} "
                             f"({result.continuous_over_static:.2f}x).")

    def stored_tables(self):
        cols = ["output_tok_s", "ttft_p50_ms", "e2e_p50_ms", "e2e_max_ms"]
        return [("per mode (ms)", self.result.table[cols].round(1))]


SWEEPS = {"2 to 32 users (~30 s on 2 cores)": (2, 4, 8, 16, 32),
          "1 to 64 users (a few minutes)": (1, 2, 4, 8, 16, 32, 64)}


# A TTFT target the three modes meet at different loads in the default sweep: on the quiet 2-core host of
# 2026-11-26 every mode's p90 TTFT stayed under 400 ms up to 32 users, so 500 ms separated nothing; at 200 ms
# continuous batching keeps more users within it than static and dynamic.
GOODPUT_SLO_MS = 200


class ConcurrencySweepLab(EnginePanel):
    """Throughput and latency against concurrency for each mode: the frontier, its knee, goodput under an SLO.

    Every mode's batch cap (``max_num_seqs``, and the dynamic batcher's size) is the sweep's largest concurrency
    unless set, so a knee inside the sweep lies below every cap and belongs to the hardware and the workload;
    each knee is checked against the caps (`ConcurrencySweep.knee_limit`) and the status says what set it."""

    # 48 short requests: more than the most users, so 32 users is still a closed loop, and TTFT p90 is a real
    # percentile (the 5th slowest of 48), not the slowest request renamed.
    def __init__(self, model, tokenizer, *, requests: int = 48, output_tokens: tuple[int, int] = (2, 8),
                 concurrencies: tuple[int, ...] = SWEEPS["2 to 32 users (~30 s on 2 cores)"],
                 max_num_seqs: int | None = None, ttft_slo_ms: int = GOODPUT_SLO_MS):
        self.workload = random_requests(requests, prompt_tokens=16, output_tokens=output_tokens, seed=1,
                                        vocab_size=model.spec.vocab_size)
        options = dict(SWEEPS)
        if concurrencies not in options.values():
            options[", ".join(map(str, concurrencies)) + " users"] = concurrencies
        self.levels = widgets.Dropdown(options=options, value=concurrencies, description="sweep")
        self.ttft_slo = widgets.IntSlider(value=ttft_slo_ms, min=100, max=5000, step=100, description="TTFT SLO ms")
        self.share, self.max_num_seqs = 0.9, max_num_seqs
        super().__init__(model, tokenizer, [self.levels], [go.Figure(), go.Figure()], redraw_only=[self.ttft_slo])

    def caps(self) -> int:
        """The batch cap every mode runs under: ``max_num_seqs`` as given, else the sweep's largest level."""
        return self.max_num_seqs or max(self.levels.value)

    def measure(self) -> ConcurrencySweep:
        def target(mode: str):
            return self.engine(mode, max_num_seqs=self.caps(), dynamic_batch_size=self.caps())

        return concurrency_sweep(target, self.workload, MODES, self.levels.value, progress=self.progress)

    def goodput_users(self) -> dict[str, float]:
        return self.result.goodput_users(self.ttft_slo.value, self.share)

    def draw(self) -> None:
        sweep: ConcurrencySweep = self.result
        curve, frontier = self.figures
        knees = sweep.knees()
        with curve.batch_update():
            curve.data = []
            for mode in MODES:
                rows = sweep.curve(mode)
                curve.add_scatter(x=rows["concurrency"], y=rows["output_tok_s"], name=mode, mode="lines+markers",
                                  line_color=COLORS[mode])
            found = knees[knees["reached"]]
            curve.add_scatter(x=found["concurrency"], y=found["output_tok_s"], mode="markers", name="knee",
                              marker={"symbol": "star", "size": 16, "color": "black"})
            top = float(sweep.frame["output_tok_s"].max())
            curve.add_scatter(x=[self.caps()] * 2, y=[0, top], mode="lines", line={"color": "gray", "dash": "dash"},
                              name=f"batch cap: max_num_seqs = dynamic batch = {self.caps()}")
            curve.update_layout(xaxis_title="concurrent users (closed loop)", yaxis_title="output tokens/s",
                                xaxis_type="log")
            style(curve, "Throughput against concurrency (knee: next level adds < 10%)", self.subtitle, height=360)
        with frontier.batch_update():
            frontier.data = []
            for mode in MODES:
                rows = sweep.curve(mode)
                for stat, dash in (("p50", "dot"), ("p90", "solid")):
                    frontier.add_scatter(x=rows["output_tok_s"], y=rows[f"ttft_{stat}_ms"], name=f"{mode} {stat}",
                                         mode="lines+markers", line={"color": COLORS[mode], "dash": dash},
                                         text=[f"{c} users" for c in rows["concurrency"]])
            frontier.add_scatter(x=found["output_tok_s"], y=found["ttft_p90_ms"], mode="markers", name="knee",
                                 marker={"symbol": "star", "size": 16, "color": "black"})
            span = [sweep.frame["output_tok_s"].min(), sweep.frame["output_tok_s"].max()]
            frontier.add_scatter(x=span, y=[self.ttft_slo.value] * 2, mode="lines", name="TTFT SLO",
                                 line={"color": "gray", "dash": "dash"})
            frontier.update_layout(xaxis_title="output tokens/s", yaxis_title="TTFT (ms)", yaxis_type="log")
            style(frontier, f"The throughput-latency frontier (TTFT p50 and p90 of {sweep.requests} requests)",
                  self.subtitle)
        good = self.goodput_users()
        knee_text = "; ".join(
            f"{m} at {k['concurrency']:.0f} users ({k['output_tok_s']:.1f} tok/s, TTFT p90 {k['ttft_p90_ms']:.0f} ms)"
            if k["reached"] else f"{m} not reached (still +{k['last_gain']:.0%} at the last step)"
            for m, k in knees.iterrows())
        last = sweep.concurrencies[-1]
        self.status.value = (f"Knees: {knee_text}. What sets them: {sweep.knee_sentence()}. With "
                             f"{self.share:.0%} of requests inside a {self.ttft_slo.value} ms TTFT SLO the most users "
                             "served is " + ", ".join(
                                 f"{m} {good[m]:g}" + (" (the sweep's end: more may pass)" if good[m] == last else "")
                                 for m in MODES) + ".")

    def stored_tables(self):
        cols = ["mode", "concurrency", "output_tok_s", "ttft_p50_ms", "ttft_p90_ms", "ttft_max_ms", "tpot_p50_ms",
                "e2e_p90_ms"]
        return [(f"closed-loop sweep, {self.result.requests} requests per run (ms)",
                 self.result.frame[cols].round(1))]
