"""Chapter 4's timing panels: TTFT by prompt length, a long prompt among decoders, and streaming.

``TtftLab`` plots time to first token against prompt length, split into time queued and time computing, for
requests sent one at a time or all at once. ``ChunkedPrefillLab`` replays a 1,024-token prompt landing among
four decoders under several schedules (chunk sizes, no chunking, static batching) and draws the per-request
token timeline, the per-step batch composition and the decoders' worst gap against chunk size.
``StreamingLab`` streams a request token by token into a live text box and compares what a reader sees with the
same request unstreamed. The engine runs are in `workbench.lab.ch04_runs`.
"""

from __future__ import annotations

import html

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.lab.ch04_runs import (
    ARRIVALS,
    DECODER_TOKENS,
    LONG_PROMPT,
    NO_CHUNKING,
    STATIC,
    ScheduleRun,
    schedule_sweep,
    stream_vs_buffered,
    ttft_sweep,
)
from workbench.lab.kit.figures import style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel

QUEUED, COMPUTING, PREFILL, DECODE = "#bbbbbb", "#1f77b4", "#d62728", "#1f77b4"
TTFT_LENGTHS = (16, 64, 256, 1024)


class TtftLab(LabPanel):
    """TTFT against prompt length: queued (arrival to admission) and computing (admission to first token)."""

    def __init__(self, model, *, lengths: tuple[int, ...] = TTFT_LENGTHS, arrivals: str = ARRIVALS[0],
                 budget: int = 512):
        self.model, self.lengths, self.budget = model, lengths, budget
        self.arrivals = widgets.ToggleButtons(options=ARRIVALS, value=arrivals, description="requests")
        fig = go.Figure()
        fig.add_bar(name="queued", marker_color=QUEUED)
        fig.add_bar(name="computing (prefill)", marker_color=COMPUTING)
        fig.add_scatter(name="if TTFT were proportional to prompt length", mode="lines+markers",
                        line={"color": "black", "dash": "dot"})
        fig.update_layout(barmode="stack")
        fig.update_xaxes(type="category", title_text="prompt tokens")
        fig.update_yaxes(title_text="time to first token (ms)")
        style(fig, "TTFT against prompt length", measured_on(model))
        self.figure, self.frame = fig, None
        super().__init__([self.arrivals], [fig])
        self.refresh()

    def measure(self) -> None:
        self.frame = ttft_sweep(self.model, self.lengths, arrivals=self.arrivals.value, budget=self.budget,
                                progress=self.progress)
        self.progress.finish(f"{len(self.frame)} requests, {self.arrivals.value}")

    def ratios(self) -> dict[str, float]:
        return ttft_ratios(self.frame)

    def draw(self) -> None:
        frame = self.frame
        x = [f"{n:,}" for n in frame["prompt_tokens"]]
        last = frame.iloc[-1]
        with self.figure.batch_update():
            queued, computing, linear = self.figure.data
            queued.x, queued.y = x, frame["queued_s"] * 1e3
            computing.x, computing.y = x, frame["computing_s"] * 1e3
            linear.x = x
            linear.y = last["ttft_s"] * 1e3 * frame["prompt_tokens"] / last["prompt_tokens"]
            self.figure.layout.title.text = f"TTFT against prompt length: {self.arrivals.value}"
        r = self.ratios()
        self.status.value = (
            f"{self.arrivals.value}: the {int(last['prompt_tokens']):,}-token prompt is {r['length_ratio']:.0f}x "
            f"longer than the {int(frame['prompt_tokens'].iloc[0]):,}-token one and its TTFT is "
            f"<b>{r['ttft_ratio']:.1f}x</b> longer ({frame['ttft_s'].iloc[0] * 1e3:.0f} → {last['ttft_s'] * 1e3:.0f} "
            f"ms). The shortest prompt spent <b>{r['shortest_queued_share']:.0%}</b> of its TTFT queued.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        f = self.frame
        return [("TTFT per request (ms)", pd.DataFrame({"prompt tokens": f["prompt_tokens"], "TTFT": f["ttft_s"] * 1e3,
                                                        "queued": f["queued_s"] * 1e3,
                                                        "computing": f["computing_s"] * 1e3}))]


def ttft_ratios(frame: pd.DataFrame) -> dict[str, float]:
    """Longest over shortest prompt of a `ttft_sweep` frame: length and TTFT ratios, and the share of the shortest
    prompt's TTFT it spent queued."""
    first, last = frame.iloc[0], frame.iloc[-1]
    return {"length_ratio": last["prompt_tokens"] / first["prompt_tokens"],
            "ttft_ratio": last["ttft_s"] / first["ttft_s"],
            "shortest_queued_share": first["queued_s"] / first["ttft_s"]}


# Chunk sizes replayed: (label with a time estimate on the 2-core CPU, sizes). Each replay costs ~6 s there.
CHUNK_SWEEPS = (("chunks of 64 and 128 (about 30 s)", (64, 128)),
                ("chunks of 32 to 512 (about 50 s)", (32, 64, 128, 256, 512)))


def _label(key: str | int) -> str:
    return key if isinstance(key, str) else f"chunks of {key}"


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
        self.sweep_figure.add_scatter(name="decoders' max ITL", mode="lines+markers+text", line={"color": DECODE},
                                      textposition="top center")
        self.sweep_figure.add_scatter(name="long prompt's TTFT", mode="lines+markers", line={"color": PREFILL})
        self.sweep_figure.update_xaxes(type="log", title_text="prefill chunk size (tokens; last point: no chunking)")
        self.sweep_figure.update_yaxes(title_text="ms", rangemode="tozero")
        style(self.sweep_figure, "Chunk size trades the decoders' worst stall against the long prompt's TTFT",
              measured_on(model), height=400)
        self.runs: dict[str | int, ScheduleRun] = {}
        super().__init__([self.sweep], [self.timeline, self.step_figure, self.sweep_figure],
                         redraw_only=[self.shown])
        self.refresh()

    @property
    def chunks(self) -> tuple[int, ...]:
        return tuple(self.sweep.value)

    def _shown_options(self) -> list[tuple[str, int | str]]:
        return [(f"chunks of {c}", c) for c in self.chunks] + [(STATIC, STATIC)]

    def measure(self) -> None:
        self.runs = schedule_sweep(self.model, [NO_CHUNKING, *self.chunks, STATIC], decoder_tokens=self.decoder_tokens,
                                   long_prompt=self.long_prompt, progress=self.progress)
        self._holding = True  # new choices for the redraw-only dropdown: redraw once, below, not per change
        try:
            shown = self.shown.value if self.shown.value in (*self.chunks, STATIC) else self.chunks[0]
            self.shown.options, self.shown.value = self._shown_options(), shown
        finally:
            self._holding = False
        self.progress.finish(f"{len(self.runs)} replays")

    def summary(self) -> pd.DataFrame:
        """One row per configuration: the decoders' max ITL, the long prompt's TTFT, steps."""
        rows = [{"schedule": _label(key), **run.summary()} for key, run in self.runs.items()]
        return pd.DataFrame(rows).set_index("schedule")

    def draw(self) -> None:
        shown = [self.runs[NO_CHUNKING], self.runs[self.shown.value]]
        with self.timeline.batch_update():
            for row, run in enumerate(shown):
                _draw_lanes(self.timeline.data[2 * row], self.timeline.data[2 * row + 1], run)
            self.timeline.layout.annotations[1].text = run.label
        with self.step_figure.batch_update():
            for row, run in enumerate(shown):
                for trace, column in zip(self.step_figure.data[2 * row: 2 * row + 2],
                                         ("num_prefill_tokens", "num_decode_tokens"), strict=True):
                    trace.x, trace.y, trace.width = run.steps["start"], run.steps[column], run.steps["duration_s"]
            self.step_figure.layout.annotations[1].text = run.label
        table = self.summary()
        # No chunking is the same as one chunk holding the whole prompt: the sweep's last point.
        swept = table.loc[[_label(c) for c in self.chunks] + [NO_CHUNKING]]
        x = [*self.chunks, self.long_prompt]
        with self.sweep_figure.batch_update():
            itl, ttft = self.sweep_figure.data
            itl.x, itl.y, itl.text = x, swept["max_itl_ms"], [""] * len(self.chunks) + [NO_CHUNKING]
            ttft.x, ttft.y = x, swept["long_ttft_ms"]
        self.status.value = self._sentence(table)

    def reference_label(self) -> str:
        """The chunked configuration the chapter quotes: chunks of 128 (the benchmark's), else the first."""
        return _label(128 if 128 in self.chunks else self.chunks[0])

    def _sentence(self, table: pd.DataFrame) -> str:
        off, on, static = table.loc[NO_CHUNKING], table.loc[self.reference_label()], table.loc[STATIC]
        alive = "" if table.drop(index=STATIC)["decoders_outlasted_prefill"].all() else (
            " <b>Note:</b> in some runs a decoder finished before the long prompt's prefill did (static batching "
            "aside, where that is the point), so its worst gap understates the stall; raise decoder_tokens.")
        return (f"Without chunking the decoders' worst gap is <b>{off['max_itl_ms']:.0f} ms</b>; with {on.name} it "
                f"is <b>{on['max_itl_ms']:.0f} ms ({off['max_itl_ms'] / on['max_itl_ms']:.1f}x lower)</b>, while the "
                f"long prompt's TTFT goes from {off['long_ttft_ms']:.0f} to {on['long_ttft_ms']:.0f} ms "
                f"({on['long_ttft_ms'] / off['long_ttft_ms'] - 1:+.0%}). Under static batching the long prompt "
                f"waits for the running batch to finish: TTFT <b>{static['long_ttft_ms']:.0f} ms</b>.{alive}")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [("Each schedule: decoders' max ITL and the long prompt's TTFT (ms)", self.summary())]


def _two_run_figures(model, long_prompt: int) -> tuple[go.Figure, go.Figure]:
    """The lanes figure and the steps figure, each with one subplot per compared run (no chunking on top)."""
    timeline = go.Figure(make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                                       subplot_titles=(NO_CHUNKING, "compared")))
    steps = go.Figure(make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                                    subplot_titles=(NO_CHUNKING, "compared")))
    for row in (1, 2):
        timeline.add_scatter(name="prefill (admitted → first token)", mode="lines", showlegend=row == 1,
                             line={"color": PREFILL, "width": 10}, row=row, col=1)
        timeline.add_scatter(name="a token arrives", mode="markers", showlegend=row == 1,
                             marker={"color": DECODE, "size": 5, "symbol": "line-ns-open"}, row=row, col=1)
        for name, color in (("prefill tokens", PREFILL), ("decode tokens", DECODE)):
            steps.add_bar(name=name, marker_color=color, showlegend=row == 1, offset=0, row=row, col=1)
    timeline.update_xaxes(title_text="seconds since the first request arrived", row=2, col=1)
    steps.update_xaxes(title_text="seconds since the first request arrived (bar width = step time)", row=2, col=1)
    steps.update_yaxes(title_text="tokens in the step")
    steps.update_layout(barmode="stack")
    style(timeline, f"A {long_prompt:,}-token prompt lands among four decoders", measured_on(model), height=520)
    style(steps, "What each engine step held", measured_on(model), height=460)
    return timeline, steps


def _draw_lanes(prefill: go.Scatter, tokens: go.Scatter, run: ScheduleRun) -> None:
    """One lane per request: a thick segment while its prompt is being prefilled, a tick at every token."""
    xs, ys = [], []
    for row in run.requests.itertuples():
        xs += [row.first_scheduled, row.first_token, None]
        ys += [row.name, row.name, None]
    prefill.x, prefill.y = xs, ys
    tokens.x, tokens.y = run.tokens["time"], run.tokens["name"]


STREAM_PROMPTS = ("Explain in a few sentences why the sky is blue.",
                  "Write a short story about a lighthouse keeper.",
                  "List five tips for writing clear documentation.")


class StreamingLab(LabPanel):
    """Tokens printed as they arrive (live), and what a reader sees over time, streamed vs not."""

    def __init__(self, engine, *, prompt: str = STREAM_PROMPTS[0], max_tokens: int = 40):
        self.engine = engine
        self.prompt = widgets.Dropdown(options=STREAM_PROMPTS, value=prompt, description="prompt",
                                       layout={"width": "480px"})
        self.max_tokens = widgets.IntSlider(value=max_tokens, min=8, max=256, step=8, description="max tokens")
        self.live = widgets.HTML("")
        fig = go.Figure()
        fig.add_scatter(name="streamed: tokens on screen", mode="lines", line={"color": DECODE, "shape": "hv"})
        fig.add_scatter(name="not streamed: tokens on screen", mode="lines", line={"color": PREFILL, "shape": "hv"})
        fig.update_xaxes(title_text="seconds since the request was sent", rangemode="tozero")
        fig.update_yaxes(title_text="tokens the reader can see", rangemode="tozero")
        style(fig, "What the reader sees, streamed or not", measured_on(engine.model), height=380)
        self.figure, self.run = fig, None
        super().__init__([self.prompt, self.max_tokens], [fig], rows=[self.live])
        self.refresh()

    def _show_live(self, text: str) -> None:
        self.live.value = f"<pre style='white-space:pre-wrap;margin:0'>{html.escape(text)}▌</pre>"

    def measure(self) -> None:
        self.progress(0, 1, "streaming")
        self.run = stream_vs_buffered(self.engine, self.prompt.value, self.max_tokens.value, on_text=self._show_live)
        self.live.value = self.live.value.replace("▌", "")
        self.progress.finish(f"{int(self.run.arrivals['tokens_seen'].iloc[-1])} tokens streamed, then the same "
                             "request unstreamed")

    def draw(self) -> None:
        run = self.run
        tokens = int(run.arrivals["tokens_seen"].iloc[-1])
        with self.figure.batch_update():
            streamed, buffered = self.figure.data
            streamed.x = [0.0, *run.arrivals["seconds"]]
            streamed.y = [0, *run.arrivals["tokens_seen"]]
            end = max(run.buffered_total_s, run.streamed_total_s)
            buffered.x, buffered.y = [0.0, run.buffered_total_s, end], [0, tokens, tokens]
        self.status.value = (
            f"Streamed, the first token was on screen after <b>{run.ttft_s * 1e3:.0f} ms</b> and all {tokens} after "
            f"{run.streamed_total_s:.2f} s; unstreamed, the reader sees nothing for <b>{run.buffered_total_s:.2f} s"
            f"</b> and then everything. Same text both ways: {run.same_text}.<br><i>{html.escape(run.text)}</i>")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        arrivals = self.run.arrivals
        table = pd.DataFrame({"ms since sent": arrivals["seconds"] * 1e3, "tokens on screen": arrivals["tokens_seen"],
                              "new text": arrivals["new_text"].map(repr)})
        return [("Token arrival times, streamed (first 12 deltas)", table.head(12))]
