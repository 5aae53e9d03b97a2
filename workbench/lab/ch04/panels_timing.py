"""Chapter 4's timing panels: TTFT by prompt length, and a long prompt among decoders.

``PrefillTTFTLab`` plots time to first token against prompt length, split into time queued and time computing,
for requests sent one at a time or all at once (`TTFTSweep`). ``ChunkedPrefillLab`` replays a 1,024-token prompt
landing among four decoders under several schedules (chunk sizes, no chunking, static batching) and draws the
per-request token timeline, the per-step batch composition and the decoders' worst gap against chunk size
(`ScheduleSweep`). The engine runs are in `workbench.lab.ch04.runs`; the streaming panel is in
`workbench.lab.ch04.panels_streaming`.
"""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.lab.ch04.runs import (
    ARRIVALS,
    DECODER_TOKENS,
    LONG_PROMPT,
    NO_CHUNKING,
    STATIC,
    ScheduleRun,
    ScheduleSweep,
    TTFTSweep,
    schedule_label,
    schedule_sweep,
    ttft_sweep,
)
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel

QUEUED, COMPUTING, PREFILL, DECODE = "#bbbbbb", "#1f77b4", "#d62728", "#1f77b4"
TTFT_LENGTHS = (16, 64, 256, 1024)
QUEUED_BAR, COMPUTING_BAR, PROPORTIONAL = ("queued", "computing (prefill)",
                                           "if TTFT were proportional to prompt length")


class PrefillTTFTLab(LabPanel):
    """TTFT against prompt length: queued (arrival to admission) and computing (admission to first token)."""

    def __init__(self, model, *, lengths: tuple[int, ...] = TTFT_LENGTHS, arrivals: str = ARRIVALS[0],
                 budget: int = 512):
        self.model, self.lengths, self.budget = model, lengths, budget
        self.arrivals = widgets.ToggleButtons(options=ARRIVALS, value=arrivals, description="requests")
        fig = go.Figure()
        fig.add_bar(name=QUEUED_BAR, marker_color=QUEUED)
        fig.add_bar(name=COMPUTING_BAR, marker_color=COMPUTING)
        fig.add_scatter(name=PROPORTIONAL, mode="lines+markers", line={"color": "black", "dash": "dot"})
        fig.update_layout(barmode="stack")
        fig.update_xaxes(type="category", title_text="prompt tokens")
        fig.update_yaxes(title_text="time to first token (ms)")
        style(fig, "TTFT against prompt length", measured_on(model))
        self.figure = fig
        super().__init__([self.arrivals], [fig])

    def measure(self) -> TTFTSweep:
        sweep = ttft_sweep(self.model, self.lengths, arrivals=self.arrivals.value, budget=self.budget,
                           progress=self.progress)
        self.progress.finish(f"{len(sweep.frame)} requests, {sweep.arrivals}")
        return sweep

    def draw(self) -> None:
        sweep: TTFTSweep = self.result
        frame = sweep.frame
        x = [f"{n:,}" for n in frame["prompt_tokens"]]
        with self.figure.batch_update():
            set_trace(self.figure, QUEUED_BAR, x=x, y=frame["queued_s"] * 1e3)
            set_trace(self.figure, COMPUTING_BAR, x=x, y=frame["computing_s"] * 1e3)
            set_trace(self.figure, PROPORTIONAL, x=x, y=sweep.ttft_long_ms * frame["prompt_tokens"] / sweep.longest)
            self.figure.layout.title.text = f"TTFT against prompt length: {sweep.arrivals}"
        ratio = sweep.ttft_ratio
        compare = (f"<b>{ratio:.1f}x</b> the short one's" if ratio >= 1 else
                   f"<b>{1 / ratio:.1f}x shorter</b> than the short one's, which waited behind it")
        self.status.value = (
            f"{sweep.arrivals}: the {sweep.longest:,}-token prompt is {sweep.length_ratio:.0f}x longer than the "
            f"{sweep.shortest:,}-token one and its TTFT is {compare} "
            f"({sweep.longest:,} tokens: {sweep.ttft_long_ms:.0f} ms; {sweep.shortest:,} tokens: "
            f"{sweep.ttft_short_ms:.0f} ms). The shortest prompt spent <b>{sweep.shortest_queued_share:.0%}</b> of "
            "its TTFT queued.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        f = self.result.frame
        return [("TTFT per request (ms)", pd.DataFrame({"prompt tokens": f["prompt_tokens"], "TTFT": f["ttft_s"] * 1e3,
                                                        "queued": f["queued_s"] * 1e3,
                                                        "computing": f["computing_s"] * 1e3}))]


# Chunk sizes replayed: (label with a time estimate on the 2-core CPU, sizes). Each replay costs ~6 s there.
CHUNK_SWEEPS = (("chunks of 64 and 128 (about 30 s)", (64, 128)),
                ("chunks of 32 to 512 (about 50 s)", (32, 64, 128, 256, 512)))
ROWS = ("no chunking", "compared")  # the two subplots of the timeline and steps figures, top to bottom
LANE_PREFILL, LANE_TOKENS = "prefill (admitted → first token)", "a token arrives"
STEP_PARTS = (("prefill tokens", "num_prefill_tokens", PREFILL), ("decode tokens", "num_decode_tokens", DECODE))
MAX_ITL, LONG_TTFT = "decoders' max ITL", "long prompt's TTFT"


def row_trace(row: str, what: str) -> str:
    """The name of one trace of a two-row figure (each row has the same kinds of trace)."""
    return f"{row}: {what}"


class ChunkedPrefillLab(LabPanel):
    """A long prompt lands among running decoders: timelines with and without chunking, max ITL by chunk size."""

    def __init__(self, model, *, chunks: tuple[int, ...] | None = None, shown: int | str = 128,
                 decoder_tokens: int = DECODER_TOKENS, long_prompt: int = LONG_PROMPT):
        self.model, self.decoder_tokens, self.long_prompt = model, decoder_tokens, long_prompt
        sweeps = CHUNK_SWEEPS if chunks is None else ((f"chunks of {', '.join(map(str, chunks))}", chunks),)
        self.sweep = widgets.Dropdown(options=[(label, sizes) for label, sizes in sweeps], value=sweeps[0][1],
                                      description="replay", layout={"width": "380px"})
        self.shown = widgets.Dropdown(options=self._shown_options(), value=shown,
                                      description="compare with no chunking:", style={"description_width": "initial"})
        self.timeline, self.step_figure = _two_run_figures(model, long_prompt)
        self.sweep_figure = go.Figure()
        self.sweep_figure.add_scatter(name=MAX_ITL, mode="lines+markers+text", line={"color": DECODE},
                                      textposition="top center")
        self.sweep_figure.add_scatter(name=LONG_TTFT, mode="lines+markers", line={"color": PREFILL})
        self.sweep_figure.update_xaxes(type="log", title_text="prefill chunk size (tokens; last point: no chunking)")
        self.sweep_figure.update_yaxes(title_text="ms", rangemode="tozero")
        style(self.sweep_figure, "Chunk size trades the decoders' worst stall against the long prompt's TTFT",
              measured_on(model), height=400)
        super().__init__([self.sweep], [self.timeline, self.step_figure, self.sweep_figure],
                         redraw_only=[self.shown])

    @property
    def chunks(self) -> tuple[int, ...]:
        return tuple(self.sweep.value)

    def _shown_options(self) -> list[tuple[str, int | str]]:
        return [(f"chunks of {c}", c) for c in self.chunks] + [(STATIC, STATIC)]

    def measure(self) -> ScheduleSweep:
        sweep = schedule_sweep(self.model, self.chunks, decoder_tokens=self.decoder_tokens,
                               long_prompt=self.long_prompt, progress=self.progress)
        self._holding = True  # new choices for the redraw-only dropdown: redraw once, below, not per change
        try:
            shown = self.shown.value if self.shown.value in (*self.chunks, STATIC) else self.chunks[0]
            self.shown.options, self.shown.value = self._shown_options(), shown
        finally:
            self._holding = False
        self.progress.finish(f"{len(sweep.runs)} replays")
        return sweep

    def draw(self) -> None:
        sweep: ScheduleSweep = self.result
        shown = dict(zip(ROWS, (sweep.runs[NO_CHUNKING], sweep.runs[self.shown.value]), strict=True))
        with self.timeline.batch_update():
            for row, run in shown.items():
                _draw_lanes(self.timeline, row, run)
            self.timeline.layout.annotations[1].text = run.label
        with self.step_figure.batch_update():
            for row, run in shown.items():
                for name, column, _ in STEP_PARTS:
                    set_trace(self.step_figure, row_trace(row, name), x=run.steps["start"], y=run.steps[column],
                              width=run.steps["duration_s"])
            self.step_figure.layout.annotations[1].text = run.label
        table = sweep.summary()
        # No chunking is the same as one chunk holding the whole prompt: the sweep's last point.
        swept = table.loc[[schedule_label(c) for c in sweep.chunks] + [NO_CHUNKING]]
        x = [*sweep.chunks, sweep.long_prompt]
        with self.sweep_figure.batch_update():
            set_trace(self.sweep_figure, MAX_ITL, x=x, y=swept["max_itl_ms"],
                      text=[""] * len(sweep.chunks) + [NO_CHUNKING])
            set_trace(self.sweep_figure, LONG_TTFT, x=x, y=swept["long_ttft_ms"])
        self.status.value = _sentence(sweep)

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [("Each schedule: decoders' max ITL and the long prompt's TTFT (ms)", self.result.summary())]


def _sentence(sweep: ScheduleSweep) -> str:
    off, on, static = sweep.row(NO_CHUNKING), sweep.row(sweep.reference_label), sweep.row(STATIC)
    alive = "" if sweep.decoders_outlasted else (
        " <b>Note:</b> in some runs a decoder finished before the long prompt's prefill did (static batching "
        "aside, where that is the point), so its worst gap understates the stall; raise decoder_tokens.")
    return (f"Without chunking the decoders' worst gap is <b>{off['max_itl_ms']:.0f} ms</b>; with {on.name} it "
            f"is <b>{on['max_itl_ms']:.0f} ms ({sweep.stall_cut:.1f}x lower)</b>, while the long prompt's TTFT goes "
            f"from {off['long_ttft_ms']:.0f} to {on['long_ttft_ms']:.0f} ms ({sweep.ttft_cost:+.0%}). Under static "
            f"batching the long prompt waits for the running batch to finish: TTFT "
            f"<b>{static['long_ttft_ms']:.0f} ms</b>.{alive}")


def _two_run_figures(model, long_prompt: int) -> tuple[go.Figure, go.Figure]:
    """The lanes figure and the steps figure, each with one subplot per compared run (no chunking on top)."""
    timeline = go.Figure(make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                                       subplot_titles=ROWS))
    steps = go.Figure(make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=ROWS))
    for i, row in enumerate(ROWS, 1):
        timeline.add_scatter(name=row_trace(row, LANE_PREFILL), legendgroup=LANE_PREFILL, showlegend=i == 1,
                             mode="lines", line={"color": PREFILL, "width": 10}, row=i, col=1)
        timeline.add_scatter(name=row_trace(row, LANE_TOKENS), legendgroup=LANE_TOKENS, showlegend=i == 1,
                             mode="markers", marker={"color": DECODE, "size": 5, "symbol": "line-ns-open"},
                             row=i, col=1)
        for name, _, color in STEP_PARTS:
            steps.add_bar(name=row_trace(row, name), legendgroup=name, marker_color=color, showlegend=i == 1,
                          offset=0, row=i, col=1)
    timeline.update_xaxes(title_text="seconds since the first request arrived", row=2, col=1)
    steps.update_xaxes(title_text="seconds since the first request arrived (bar width = step time)", row=2, col=1)
    steps.update_yaxes(title_text="tokens in the step")
    steps.update_layout(barmode="stack")
    style(timeline, f"A {long_prompt:,}-token prompt lands among four decoders", measured_on(model), height=520)
    style(steps, "What each engine step held", measured_on(model), height=460)
    return timeline, steps


def _draw_lanes(fig: go.Figure, row: str, run: ScheduleRun) -> None:
    """One lane per request: a thick segment while its prompt is being prefilled, a tick at every token."""
    xs, ys = [], []
    for request in run.requests.itertuples():
        xs += [request.first_scheduled, request.first_token, None]
        ys += [request.name, request.name, None]
    set_trace(fig, row_trace(row, LANE_PREFILL), x=xs, y=ys)
    set_trace(fig, row_trace(row, LANE_TOKENS), x=run.tokens["time"], y=run.tokens["name"])
