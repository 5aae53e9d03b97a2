"""Chapter 8's live serving dashboard over scraped /metrics, and the figure of TPOT against ITL from its run.

The dashboard drives load at a server by URL (ours, started by `workbench.lab.ch08.server.serve`, or any
vLLM-compatible endpoint) and scrapes its /metrics meanwhile (`workbench.lab.ch08.runs.run_dashboard`); while
the load runs it redraws its figure about once a second, so a reader with a live kernel watches the quantities
move. The stored notebook keeps the last state.
"""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from IPython.display import display
from plotly.subplots import make_subplots

from workbench.lab.ch08.latency import TokenLatency
from workbench.lab.ch08.runs import FAULTS, RULE, WINDOW_S, DashboardRun, run_dashboard
from workbench.lab.kit.figures import style
from workbench.lab.kit.panel import LabPanel
from workbench.lab.kit.panel import current_execution as _current_execution
from workbench.lab.kit.stored import figure_bundle
from workbench.monitoring.dashboard import panel_frame

# (row, col) of each series in the dashboard's 2 x 3 grid; the series name is the trace's name
GRID = {"ttft_p50_s": (1, 1), "ttft_p99_s": (1, 1), "itl_p50_s": (1, 2), "itl_p99_s": (1, 2), "running": (1, 3),
        "waiting": (1, 3), "kv_usage": (2, 1), "prefix_hit_rate": (2, 1), "generation_tokens_per_s": (2, 2),
        "preemptions_per_s": (2, 3)}
ALERT_TRACES = ("p99 TTFT (s)", "2 x baseline", "firing")
TPOT, ITL = "TPOT, one per request", "ITL, one per gap between streamed tokens"


class DashboardLab(LabPanel):
    """The serving dashboard: TTFT/ITL p50/p99, running/waiting, KV usage, prefix hit rate, tokens/s, preemptions,
    and the p99-TTFT change alert, while a load (with or without an injected fault) runs against ``url``."""

    def __init__(self, url: str, subtitle: str, *, fault: str = FAULTS[0], interval_s: float = 0.25):
        self.url, self.subtitle, self.interval_s = url, subtitle, interval_s
        self.fault = widgets.Dropdown(options=list(FAULTS), value=fault, description="fault")
        self.rate = widgets.FloatSlider(value=6.0, min=2.0, max=12.0, step=1.0, description="steady req/s")
        self._live_panels: pd.DataFrame | None = None
        super().__init__([self.fault, self.rate], [go.Figure(), go.Figure()])

    def measure(self) -> DashboardRun:
        self._live_panels = None
        run = run_dashboard(self.url, self.fault.value, rate=self.rate.value, interval_s=self.interval_s,
                            progress=self.progress, on_samples=self._live)
        self.progress.finish(f"{len(run.bench.requests)} requests, {run.samples['time'].nunique()} scrapes")
        return run

    def _live(self, samples: pd.DataFrame) -> None:
        """Redraw while the load runs, but only where the panel's outputs can be updated in place."""
        if not self._handles or samples["time"].nunique() < 3:
            return
        execution = _current_execution()
        if execution is not None and execution != self._shown_in:
            return
        self._live_panels = panel_frame(samples, WINDOW_S)
        self._draw(self._live_panels, None)
        self.publish()

    def draw(self) -> None:
        self._draw(self.result.panels, self.result)

    def _draw(self, p: pd.DataFrame, run: DashboardRun | None) -> None:
        fig = make_subplots(rows=2, cols=3, subplot_titles=(
            "TTFT p50 / p99 (s)", "ITL p50 / p99 (s)", "running / waiting", "KV usage, prefix hit rate",
            "generated tokens/s", "preemptions/s"), vertical_spacing=0.16)
        for name, (row, col) in GRID.items():
            fig.add_trace(go.Scatter(x=p.index, y=p[name], name=name, mode="lines"), row=row, col=col)
        self.figures[0] = style(fig, f"Serving dashboard ({self.fault.value}, {WINDOW_S:.0f} s windows)",
                                self.subtitle, height=560)
        alert = go.Figure()
        alert.add_trace(go.Scatter(x=p.index, y=p["ttft_p99_s"], name=ALERT_TRACES[0]))
        if run is not None:
            t = run.alert.table
            alert.add_trace(go.Scatter(x=t["time"], y=RULE.factor * t["baseline"], name=ALERT_TRACES[1],
                                       line={"dash": "dot"}))
            firing = t[t["firing"]]
            alert.add_trace(go.Scatter(x=firing["time"], y=firing["value"], name=ALERT_TRACES[2], mode="markers",
                                       marker={"color": "#d62728", "size": 9}))
            if run.has_burst:
                alert.add_vline(x=run.burst_t, line_dash="dash", annotation_text="burst arrives")
        alert.update_xaxes(title="seconds from the first scrape")
        self.figures[1] = style(alert, f"Alert rule: {RULE.name} (baseline {RULE.baseline_s:.0f} s ending "
                                f"{RULE.gap_s:.0f} s back, held {RULE.hold_s} s)", self.subtitle, height=380)
        if run is None:
            self.status.value = "<i>load running…</i>"
        else:
            fired = (f"fired at {run.alert.fired_at:.2f} s" if run.alert.fired else "did not fire")
            self.status.value = (f"<b>{run.fault}</b>: peak waiting {run.peak_waiting:.0f}, peak KV usage "
                                 f"{run.peak_kv_usage:.0%}, p99 TTFT up to {run.peak_ttft_p99_s:.2f} s; "
                                 f"the alert {fired}")


def latency_figure(latency: TokenLatency, subtitle: str) -> go.Figure:
    """The two distributions from one run, as cumulative shares (log x: the ITL tail is far out)."""
    fig = go.Figure()
    for name, values in ((TPOT, latency.tpot_ms), (ITL, latency.itl_ms)):
        ordered = values.sort_values().to_numpy()
        fig.add_trace(go.Scatter(x=ordered, y=[(i + 1) / len(ordered) for i in range(len(ordered))], name=name,
                                 mode="lines", line={"shape": "hv"}))
    fig.update_xaxes(title="ms", type="log").update_yaxes(title="share at or below", range=[0, 1.02])
    return style(fig, f"TPOT and ITL from the same run: p99 {latency.tpot_p99:.0f} ms against "
                      f"{latency.itl_p99:.0f} ms", subtitle)


def show_latency(latency: TokenLatency, subtitle: str) -> None:
    """``latency_figure``, with no controls, stored the way panels store theirs (plotly JSON, HTML, PNG)."""
    display(figure_bundle(latency_figure(latency, subtitle)), raw=True)
