"""Chapter 7's first three panels: the cost of a forward, one request pass by pass, acceptance by position.

``ForwardCostLab`` times one target forward against the positions it processes (why verifying drafts starts out
free); ``TokenTraceLab`` shows one request's drafts, accepted and rejected, token by token; ``AcceptanceLab``
runs a task set with both proposers beside plain decoding and plots acceptance by draft position against
independent acceptance at the measured α, and each proposer's speedup against the model's prediction. Runs
live in `workbench.spec_experiments`, `workbench.lab.ch07.runs` and `workbench.lab.ch07.trace`; this module turns
controls into runs and runs into figures. Each panel measures when asked (``.run()``, first display, or
``.result``).
"""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.data import load_prompts
from workbench.lab.ch07.runs import AcceptanceRun, acceptance_run
from workbench.lab.ch07.trace import ACCEPTED, REJECTED, UNTESTED, RequestTrace, trace_html, trace_request
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.spec_experiments.forward_cost import POSITIONS, ForwardCurve, forward_curve
from workbench.spec_experiments.methods import PLAIN, PROPOSERS, TASKS

COLORS = {"prompt lookup": "#1f77b4", "trained draft": "#ff7f0e", PLAIN: "#7f7f7f"}
TEMPERATURES = [("0 (greedy)", 0.0), ("0.7", 0.7), ("1.0", 1.0)]
MEASURED_FORWARD, ROOFLINE = "measured forward", "roofline: max(weights ÷ bandwidth, FLOPs ÷ peak rate)"
MARKS = "plain step (B positions) → verifying step (B·(K+1))"
FATES = {"accepted": "accepted", "rejected": "rejected", "never tested": "untested"}  # trace name -> column
EMITTED = "tokens emitted"
POSITION_TRACES = {"α at position i: accepted ÷ tested": "alpha",
                   "accepted ÷ drafted at position i": "acceptance_rate",
                   "theory: α (the same at every position)": "alpha_theory",
                   "theory: αⁱ (every earlier draft accepted too)": "acceptance_rate_theory"}
SPEED_TRACES = {"measured": "speedup", "model: E ÷ (r + K·c), r and c measured": "speedup_model",
                "textbook: E ÷ (1 + K·c), verification free": "speedup_textbook"}


def proposer_control(value: str = "prompt lookup") -> widgets.ToggleButtons:
    return widgets.ToggleButtons(options=list(PROPOSERS), value=value, description="proposer")


def k_control(value: int = 4, high: int = 8) -> widgets.IntSlider:
    return widgets.IntSlider(value=value, min=1, max=high, description="K (drafts)")


def task_control(value: str = "grounded") -> widgets.ToggleButtons:
    return widgets.ToggleButtons(options=list(TASKS), value=value, description="task")


def temperature_control(value: float = 0.0) -> widgets.Dropdown:
    return widgets.Dropdown(options=TEMPERATURES, value=value, description="temperature")


class ForwardCostLab(LabPanel):
    """Time of one target forward against its positions, with the fitted roofline; marks B and B·(K+1)."""

    def __init__(self, model, *, k: int = 4, batch: int = 1, positions: tuple[int, ...] = POSITIONS):
        self.model, self.positions = model, positions
        self.k = k_control(k)
        self.batch = widgets.Dropdown(options=[1, 4, 16], value=batch, description="sequences")
        fig = go.Figure()
        fig.add_scatter(name=MEASURED_FORWARD, mode="lines+markers", line={"color": "#1f77b4"})
        fig.add_scatter(name=ROOFLINE, mode="lines",
                        line={"color": "#7f7f7f", "dash": "dash"})
        fig.add_scatter(name=MARKS, mode="markers+text",
                        marker={"size": 12, "color": "#d62728"}, textposition="top left")
        fig.update_xaxes(title_text="positions in the forward (sequences × tokens each)", type="log")
        fig.update_yaxes(title_text="time of one forward (ms)", type="log")
        style(fig, "One target forward against the positions it processes", measured_on(model))
        self.figure = fig
        super().__init__([], [fig], redraw_only=[self.k, self.batch])

    def measure(self) -> ForwardCurve:
        return forward_curve(self.model, self.positions, progress=self.progress)

    @property
    def curve(self) -> ForwardCurve:
        return self.result

    def verify_ratio(self) -> float:
        b = self.batch.value
        return self.curve.ratio(b * (self.k.value + 1), b)

    def draw(self) -> None:
        curve, frame, b, k = self.curve, self.curve.frame, self.batch.value, self.k.value
        with self.figure.batch_update():
            set_trace(self.figure, MEASURED_FORWARD, x=frame["positions"], y=frame["ms"])
            set_trace(self.figure, ROOFLINE, x=frame["positions"], y=[curve.roofline_ms(n) for n in frame["positions"]])
            set_trace(self.figure, MARKS, x=[b, b * (k + 1)], y=[curve.ms(b), curve.ms(b * (k + 1))],
                      text=[f"B={b}", f"B·(K+1)={b * (k + 1)}: r={self.verify_ratio():.2f}"])
        self.status.value = (
            f"One position takes <b>{curve.ms(1):.1f} ms</b> (the weights stream at {curve.bandwidth / 1e9:.1f} GB/s); "
            f"{k + 1} positions take {curve.ms(k + 1):.1f} ms, so verifying K={k} drafts costs "
            f"<b>r = {curve.ratio(k + 1):.2f}</b> plain steps at batch 1"
            + (" (below 1 is the clock's noise: a wider forward cannot cost less, so the model takes r = 1)"
               if curve.ratio(k + 1) < 1 else "")
            + f". With {b} sequences: {b} → {b * (k + 1)} "
            f"positions, <b>r = {self.verify_ratio():.2f}</b>. The two ceilings meet near "
            f"{curve.ridge_positions:.0f} positions ({curve.flops_rate / 1e9:.0f} GFLOP/s at the largest forward).")


def trace_choices() -> list[tuple[str, str]]:
    """(label, prompt) for the token-by-token panel: every grounded task and a few open chat prompts."""
    grounded = [(f"grounded: {p.split(chr(10))[0][:48]}…", p) for p in load_prompts("grounded")]
    chat = [(f"chat: {p[:48]}…", p) for p in load_prompts("draft_heldout")[:4]]
    return grounded + chat


class TokenTraceLab(LabPanel):
    """One request, pass by pass: drafts accepted, rejected and never tested, and the target's own tokens."""

    def __init__(self, model, tokenizer, draft, *, proposer: str = "prompt lookup", k: int = 4,
                 max_tokens: int = 48, request: int = 0):
        self.model, self.tokenizer, self.draft, self.max_tokens = model, tokenizer, draft, max_tokens
        choices = trace_choices()
        self.request = widgets.Dropdown(options=choices, value=choices[request][1], description="request",
                                        layout={"width": "460px"})
        self.proposer, self.k, self.temperature = proposer_control(proposer), k_control(k), temperature_control()
        fig = go.Figure()
        for name, color in (("accepted", ACCEPTED), ("rejected", REJECTED), ("never tested", UNTESTED)):
            fig.add_bar(name=name, marker_color=color, marker_line={"color": "#555", "width": 0.5})
        fig.add_scatter(name=EMITTED, mode="markers", marker={"color": "black", "symbol": "diamond"})
        fig.update_layout(barmode="stack")
        fig.update_xaxes(title_text="verification pass")
        fig.update_yaxes(title_text="drafted tokens", rangemode="tozero")
        style(fig, "Every verification pass of one request", measured_on(model), height=360)
        self.figure = fig
        super().__init__([self.request, self.proposer, self.k, self.temperature], [fig])

    def measure(self) -> RequestTrace:
        self.progress(0, 1, "generating")
        trace = trace_request(self.model, self.tokenizer, self.request.value, PROPOSERS[self.proposer.value],
                                   self.k.value, max_tokens=self.max_tokens, temperature=self.temperature.value,
                                   draft=self.draft)
        self.progress.finish(f"{len(trace.output_ids)} tokens")
        return trace

    @property
    def trace(self) -> RequestTrace:
        return self.result

    def draw(self) -> None:
        frame, trace = self.trace.frame(), self.trace
        with self.figure.batch_update():
            for name, column in FATES.items():
                set_trace(self.figure, name, x=frame["pass"], y=frame[column])
            set_trace(self.figure, EMITTED, x=frame["pass"], y=frame["emitted"])
            self.figure.layout.title.text = (f"Every verification pass of one request: {self.proposer.value}, "
                                             f"K={self.k.value}, temperature {self.temperature.value:g}")
        drafted, accepted = int(frame["drafted"].sum()), int(frame["accepted"].sum())
        tested = int((frame["accepted"] + frame["rejected"]).sum())
        same = {True: "identical to plain greedy decoding", False: "DIFFERENT from plain greedy decoding",
                None: "sampled: compared by distribution instead (the sampling check)"}[trace.same_as_plain]
        self.status.value = (
            f"<b>{len(trace.output_ids)} tokens</b> in <b>{trace.target_passes()} target passes</b> after the "
            f"prefill (plain decoding needs {len(trace.output_ids) - 1}); {len(frame)} passes verified drafts: "
            f"{drafted} drafted, {tested} tested, {accepted} accepted (α = {accepted / max(tested, 1):.2f}). "
            f"Output {same}.<br>{trace_html(trace, self.tokenizer)}")


SUMMARY_COLUMNS = ["decode_tokens_per_s", "speedup", "drafted", "tested", "accepted", "alpha",
                   "accepted_per_drafted", "tokens_per_pass", "tokens_per_pass_theory", "draft_cost_c",
                   "verify_cost_r", "speedup_model", "same_as_plain"]


class AcceptanceLab(LabPanel):
    """A task set with both proposers beside plain decoding: acceptance by position and speedups, with theory."""

    def __init__(self, model, tokenizer, draft, *, task: str = "grounded", k: int = 4, num_prompts: int = 2,
                 max_tokens: int = 40):
        self.model, self.tokenizer, self.draft = model, tokenizer, draft
        self.num_prompts, self.max_tokens = num_prompts, max_tokens
        self.task, self.k, self.temperature = task_control(task), k_control(k), temperature_control()
        self.shown = proposer_control()
        self.shown.description = "positions of"
        positions = go.Figure()
        bars, lines = list(POSITION_TRACES)[:2], list(POSITION_TRACES)[2:]
        for name, color in zip(bars, ("#2ca02c", "#9467bd"), strict=True):
            positions.add_bar(name=name, marker_color=color)
        for name, color in zip(lines, ("#2ca02c", "#9467bd"), strict=True):
            positions.add_scatter(name=name, mode="lines+markers", line={"color": color, "dash": "dash"})
        positions.update_xaxes(title_text="draft position i", dtick=1)
        positions.update_yaxes(title_text="rate", range=[0, 1.05])
        style(positions, "Acceptance by draft position", measured_on(model))
        speed = go.Figure()
        for name, color in zip(SPEED_TRACES, (None, "#bcbd22", "#17becf"), strict=True):
            speed.add_bar(name=name, marker_color=color, textposition="outside")
        speed.update_yaxes(title_text="decode speed ÷ plain decoding", rangemode="tozero")
        style(speed, "Speedup against plain decoding, measured in the same run", measured_on(model), height=380)
        self.positions_figure, self.speed_figure = positions, speed
        self.history: list[AcceptanceRun] = []
        super().__init__([self.task, self.k, self.temperature], [positions, speed], redraw_only=[self.shown])

    def measure(self) -> AcceptanceRun:
        run = acceptance_run(self.model, self.tokenizer, self.draft, task=self.task.value, k=self.k.value,
                             temperature=self.temperature.value, num_prompts=self.num_prompts,
                             max_tokens=self.max_tokens, progress=self.progress)
        self.history.append(run)
        return run

    @property
    def comparison(self):
        return self.result.comparison

    def summary(self) -> pd.DataFrame:
        return self.result.summary

    def latest(self, task: str, temperature: float = 0.0) -> AcceptanceRun | None:
        """The latest run on ``task`` at ``temperature`` (None if there was none)."""
        runs = [run for run in self.history if run.task == task and run.temperature == temperature]
        return runs[-1] if runs else None

    def history_frame(self) -> pd.DataFrame:
        """Every run so far: one row per (task, K, temperature, proposer)."""
        rows = [{"task": h.task, "K": h.k, "temperature": h.temperature, "proposer": label,
                 **h.summary.loc[label, ["speedup", "alpha", "accepted_per_drafted", "tokens_per_pass"]]}
                for h in self.history for label in PROPOSERS]
        return pd.DataFrame(rows)

    def draw(self) -> None:
        shown, summary = self.shown.value, self.summary()
        frame = self.comparison.positions(shown)
        with self.positions_figure.batch_update():
            for name, column in POSITION_TRACES.items():
                set_trace(self.positions_figure, name, x=frame["position"], y=frame[column])
            self.positions_figure.layout.title.text = (
                f"Acceptance by draft position: {shown}, {self.task.value}, K={self.k.value}, "
                f"pooled α = {summary.loc[shown, 'alpha']:.2f}")
        labels = list(PROPOSERS)
        with self.speed_figure.batch_update():
            for name, column in SPEED_TRACES.items():
                set_trace(self.speed_figure, name, x=labels, y=summary.loc[labels, column],
                          text=[f"{v:.2f}x" for v in summary.loc[labels, column]])
            set_trace(self.speed_figure, "measured", marker={"color": [COLORS[label] for label in labels]})
            self.speed_figure.layout.shapes = [{"type": "line", "x0": -0.5, "x1": 1.5, "y0": 1, "y1": 1,
                                                "line": {"color": "black", "dash": "dot"}}]
        self.status.value = self._sentence(summary)

    def _sentence(self, summary: pd.DataFrame) -> str:
        parts = []
        for label in PROPOSERS:
            row = summary.loc[label]
            same = "" if row["same_as_plain"] is None else f", same tokens as plain: {row['same_as_plain']}"
            parts.append(f"{label} <b>{row['speedup']:.2f}x</b> (α = {row['alpha']:.2f}, "
                         f"{row['tokens_per_pass']:.2f} tokens per pass against {row['tokens_per_pass_theory']:.2f} "
                         f"from the formula{same})")
        plain = summary.loc[PLAIN, "decode_tokens_per_s"]
        return (f"{self.task.value}, {self.num_prompts} requests × {self.max_tokens} tokens, K={self.k.value}, "
                f"temperature {self.temperature.value:g}: plain decoding <b>{plain:.1f} tokens/s</b>; "
                + "; ".join(parts) + ".")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        summary = self.summary()[SUMMARY_COLUMNS].copy()
        summary["same_as_plain"] = summary["same_as_plain"].astype(str)
        return [("Per method (decode phase; c, r: drafting and verifying cost over a plain decode step)", summary)]
