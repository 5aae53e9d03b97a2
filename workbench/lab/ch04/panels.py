"""Chapter 4's roofline panels: where real prefill and decode steps sit under this device's measured ceilings,
and what a decode step's inter-token latency is made of.

``RooflineLab`` measures the device's peaks (or takes them), times prefill steps by prompt length and decode
steps by batch size, and draws them on a log-log roofline with the ridge point. ``DecodeLab`` times decode
steps against batch size and context length next to their floor (bytes / bandwidth), and splits the bytes a
decode step moves per generated token into weights, KV and activations. The measuring is in
`workbench.lab.ch04.steps` (on `workbench.roofline`); this module builds widgets and figures.
"""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.lab.ch04.steps import DecodeSweep, RooflineSteps, decode_sweep, roofline_steps
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.roofline import DevicePeaks

PREFILL, DECODE, ROOF = "#d62728", "#1f77b4", "#444444"
ROOF_LINE, PREFILL_POINTS, DECODE_POINTS = ("roof: min(peak FLOP/s, bandwidth × intensity)",
                                            "prefill steps (label: prompt tokens)", "decode steps (label: batch size)")
# Sweeps per device: (label with a time estimate on the 2-core CPU, prompt lengths, decode batches, decode context).
ROOFLINE_SWEEPS = {
    "cpu": [("prompts 16-1,024, batches 1-16 (about 15 s)", (16, 64, 256, 1024), (1, 4, 16), 32),
            ("prompts 16-2,048, batches 1-64 (about 40 s)", (16, 64, 256, 1024, 2048), (1, 4, 16, 64), 32)],
    "cuda": [("prompts 64-4,096, batches 1-64", (64, 256, 1024, 4096), (1, 8, 64), 128),
             ("prompts 64-8,192, batches 1-256", (64, 256, 1024, 4096, 8192), (1, 8, 64, 256), 128)],
}


def _gflop(x: float) -> float:
    return x / 1e9


class RooflineLab(LabPanel):
    """The measured roofline of this device, with the model's prefill and decode steps on it."""

    def __init__(self, model, *, peaks: DevicePeaks | None = None, sweep: int = 0,
                 sweeps: list[tuple[str, tuple[int, ...], tuple[int, ...], int]] | None = None,
                 peak_options: dict | None = None):
        self.model, self.peaks, self.peak_options = model, peaks, peak_options or {}
        self.sweeps = sweeps or ROOFLINE_SWEEPS[model.device.type]
        options = [(label, i) for i, (label, *_rest) in enumerate(self.sweeps)]
        self.sweep = widgets.Dropdown(options=options, value=sweep, description="sweep", layout={"width": "420px"})
        self.remeasure = widgets.Checkbox(value=False, description="re-measure the peaks too")
        fig = go.Figure()
        fig.add_scatter(name=ROOF_LINE, mode="lines",
                        line={"color": ROOF, "width": 3})
        fig.add_scatter(name=PREFILL_POINTS, mode="markers+text", textposition="top left",
                        marker={"color": PREFILL, "size": 11})
        fig.add_scatter(name=DECODE_POINTS, mode="markers+text", textposition="bottom right",
                        marker={"color": DECODE, "size": 11, "symbol": "diamond"})
        fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte moved)")
        fig.update_yaxes(type="log", title_text="achieved GFLOP/s")
        style(fig, "Roofline of this device, measured", measured_on(model), height=480)
        self.figure = fig
        super().__init__([self.sweep, self.remeasure], [fig])

    def measure(self) -> RooflineSteps:
        _, lengths, batches, context = self.sweeps[self.sweep.value]
        given = None if self.remeasure.value else self.peaks
        steps = roofline_steps(self.model, given, lengths, batches, context, peak_options=self.peak_options,
                               progress=self.progress)
        self.peaks = steps.peaks
        self.progress.finish(f"{len(steps.points)} steps timed")
        return steps

    def draw(self) -> None:
        peaks, points = self.result.peaks, self.result.points
        lo = min(points["intensity"].min(), peaks.ridge) / 4
        hi = max(points["intensity"].max(), peaks.ridge) * 4
        grid = np.geomspace(lo, hi, 200)
        prefill, decode = points[points["kind"] == "prefill"], points[points["kind"] == "decode"]
        with self.figure.batch_update():
            set_trace(self.figure, ROOF_LINE, x=grid, y=[_gflop(peaks.roof(i)) for i in grid])
            for name, rows, labels in ((PREFILL_POINTS, prefill, [f"{n:,}" for n in prefill["context"]]),
                                       (DECODE_POINTS, decode, [f"b={b}" for b in decode["batch"]])):
                set_trace(self.figure, name, x=rows["intensity"], y=rows["flops_per_s"].map(_gflop), text=labels,
                          customdata=np.stack([rows["step_s"] * 1e3, rows["share_of_roof"] * 100], axis=-1),
                          hovertemplate=("intensity %{x:.2f} FLOP/B<br>%{y:.2f} GFLOP/s<br>step %{customdata[0]:.1f} "
                                         "ms<br>%{customdata[1]:.0f}% of the roof<extra></extra>"))
            self.figure.layout.shapes = [{"type": "line", "x0": peaks.ridge, "x1": peaks.ridge, "y0": 0, "y1": 1,
                                          "yref": "paper", "line": {"color": ROOF, "dash": "dot"}}]
            self.figure.layout.annotations = [{"x": np.log10(peaks.ridge), "y": 1.0, "yref": "paper",
                                               "text": f"ridge {peaks.ridge:.1f} FLOP/B", "showarrow": False,
                                               "xanchor": "left", "yanchor": "bottom"}]
        self.status.value = self._sentence()

    def _sentence(self) -> str:
        peaks = self.result.peaks
        one, long = self.result.decode_one, self.result.longest_prefill
        return (f"Measured here: peak <b>{_gflop(peaks.flops_per_s):,.1f} GFLOP/s</b> ({peaks.dtype} matrix products) "
                f"and <b>{peaks.bytes_per_s / 1e9:,.1f} GB/s</b>, so the ridge sits at <b>{peaks.ridge:.1f} FLOP per "
                f"byte</b>. A batch-1 decode step does {one['intensity']:.2f} FLOP/B: <b>{one['bound']}-bound</b>, "
                f"reaching {one['share_of_roof']:.0%} of its roof. A {int(long['context']):,}-token prefill does "
                f"{long['intensity']:.0f} FLOP/B: <b>{long['bound']}-bound</b>, at {long['share_of_roof']:.0%} of "
                "the peak.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [("Every step on the roofline", steps_table(self.result.points)),
                ("The device's ceilings, per probe", peaks_table(self.result.peaks))]


def steps_table(points: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "step": points["kind"], "batch": points["batch"], "context": points["context"],
        "time (ms)": points["step_s"] * 1e3, "GFLOP": points["flops"] / 1e9, "MB moved": points["bytes"] / 1e6,
        "FLOP/B": points["intensity"], "GFLOP/s": points["flops_per_s"] / 1e9, "GB/s": points["bytes_per_s"] / 1e9,
        "bound": points["bound"], "% of roof": points["share_of_roof"] * 100})


def peaks_table(peaks: DevicePeaks) -> pd.DataFrame:
    rows = [{"ceiling": "FLOP/s", "probe": k, "value (G/s)": v / 1e9} for k, v in peaks.flops_by_probe.items()]
    rows += [{"ceiling": "bytes/s", "probe": k, "value (G/s)": v / 1e9} for k, v in peaks.bandwidth_by_probe.items()]
    return pd.DataFrame(rows)


DECODE_BATCHES = (1, 2, 4, 8, 16)
CONTEXTS = (32, 256, 1024)
PARTS = (("weights", "bytes_weights", "#7f7f7f"), ("KV read + written", "bytes_kv", "#9467bd"),
         ("activations", "bytes_activations", "#ff7f0e"))


MEASURED_STEP, FLOOR = "measured step (ITL)", "floor: bytes / measured bandwidth"
SWEEPS = (("by batch", "batch", "sequences decoding together"), ("by context", "context", "context length (tokens)"))


class DecodeLab(LabPanel):
    """Decode step time (ITL) against batch size and context, next to bytes / bandwidth; bytes per token."""

    def __init__(self, model, peaks: DevicePeaks, *, context: int = 32, batches: tuple[int, ...] = DECODE_BATCHES,
                 contexts: tuple[int, ...] = CONTEXTS, steps: int = 4):
        self.model, self.peaks, self.batches, self.contexts, self.steps = model, peaks, batches, contexts, steps
        self.context = widgets.Dropdown(options=[(f"{c:,} tokens", c) for c in contexts], value=context,
                                        description="context of the batch sweep",
                                        style={"description_width": "initial"})
        fig = go.Figure(make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
            "against batch size", "against context length (batch 1)")))
        for col, (sweep, _, title) in enumerate(SWEEPS, 1):
            fig.add_scatter(name=f"{sweep}: {MEASURED_STEP}", legendgroup=MEASURED_STEP, mode="lines+markers",
                            line={"color": DECODE}, showlegend=col == 1, row=1, col=col)
            fig.add_scatter(name=f"{sweep}: {FLOOR}", legendgroup=FLOOR, mode="lines+markers",
                            line={"color": ROOF, "dash": "dash"}, showlegend=col == 1, row=1, col=col)
            fig.update_xaxes(type="log", title_text=title, row=1, col=col)
        fig.update_yaxes(title_text="time per decode step (ms)", rangemode="tozero")
        style(fig, "Decode: inter-token latency and its bandwidth floor", measured_on(model))
        parts = go.Figure()
        for name, _, color in PARTS:
            parts.add_bar(name=name, marker_color=color)
        parts.update_layout(barmode="stack")
        parts.update_xaxes(type="category", title_text="sequences decoding together")
        parts.update_yaxes(title_text="MB moved per generated token")
        style(parts, "Why decode is bandwidth-bound: bytes moved per generated token", measured_on(model),
              height=380)
        self.figure, self.parts_figure = fig, parts
        super().__init__([self.context], [fig, parts])

    def measure(self) -> DecodeSweep:
        sweep = decode_sweep(self.model, self.peaks, self.batches, self.context.value, self.contexts,
                             steps=self.steps, progress=self.progress)
        self.progress.finish(f"{len(sweep.by_batch) + len(sweep.by_context)} decode configurations timed")
        return sweep

    def draw(self) -> None:
        sweep: DecodeSweep = self.result
        with self.figure.batch_update():
            for (name, x, _), frame in zip(SWEEPS, (sweep.by_batch, sweep.by_context), strict=True):
                set_trace(self.figure, f"{name}: {MEASURED_STEP}", x=frame[x], y=frame["step_s"] * 1e3)
                set_trace(self.figure, f"{name}: {FLOOR}", x=frame[x], y=frame["bandwidth_floor_s"] * 1e3)
        with self.parts_figure.batch_update():
            for name, column, _ in PARTS:
                set_trace(self.parts_figure, name, x=[str(b) for b in sweep.by_batch["batch"]],
                          y=sweep.by_batch[column] / sweep.by_batch["batch"] / 1e6)
        one, big = sweep.by_batch.iloc[0], sweep.by_batch.iloc[-1]
        ctx_lo, ctx_hi = sweep.by_context.iloc[0], sweep.by_context.iloc[-1]
        floor = one["bandwidth_floor_s"]
        self.status.value = (
            f"Batch 1: a step takes <b>{one['step_s'] * 1e3:.1f} ms</b>, {sweep.floor_ratio:.1f}x its floor of "
            f"{floor * 1e3:.1f} ms (moving {one['bytes'] / 1e6:,.0f} MB at the measured bandwidth). "
            f"Batch {sweep.largest_batch}: {big['step_s'] * 1e3:.1f} ms per step, "
            f"{sweep.itl_growth:.1f}x batch 1's for {sweep.largest_batch}x the tokens. Context "
            f"{int(ctx_lo['context']):,} → {int(ctx_hi['context']):,} at batch 1: {ctx_lo['step_s'] * 1e3:.1f} → "
            f"<b>{ctx_hi['step_s'] * 1e3:.1f} ms</b> (KV read per step {ctx_lo['bytes_kv_read'] / 1e6:.1f} → "
            f"{ctx_hi['bytes_kv_read'] / 1e6:.1f} MB).")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        frame = pd.concat([self.result.by_batch, self.result.by_context], ignore_index=True)
        table = pd.DataFrame({"batch": frame["batch"], "context": frame["context"],
                              "step (ms)": frame["step_s"] * 1e3, "floor (ms)": frame["bandwidth_floor_s"] * 1e3,
                              "weights MB/token": frame["bytes_weights"] / frame["batch"] / 1e6,
                              "KV MB/token": frame["bytes_kv"] / frame["batch"] / 1e6,
                              "tokens/s": frame["batch"] / frame["step_s"]})
        return [("Decode steps: measured time, bandwidth floor, bytes per generated token", table)]
