"""Chapter 4's streaming panel: ``StreamingLab`` streams a request token by token into a live text box, then
times the same request streamed and unstreamed in alternating order (`workbench.lab.ch04.streaming`), and draws
what a reader sees over time in each case."""

from __future__ import annotations

import html

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.lab.ch04.streaming import StreamRun, stream_vs_buffered
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel

STREAM_PROMPTS = ("Explain in a few sentences why the sky is blue.",
                  "Write a short story about a lighthouse keeper.",
                  "List five tips for writing clear documentation.")
STREAMED_LINE, BUFFERED_LINE = "streamed: tokens on screen", "not streamed: tokens on screen"


class StreamingLab(LabPanel):
    """Tokens printed as they arrive (live), and what a reader sees over time, streamed vs not."""

    def __init__(self, engine, *, prompt: str = STREAM_PROMPTS[0], max_tokens: int = 40, rounds: int = 2):
        self.engine, self.rounds = engine, rounds
        self.prompt = widgets.Dropdown(options=STREAM_PROMPTS, value=prompt, description="prompt",
                                       layout={"width": "480px"})
        self.max_tokens = widgets.IntSlider(value=max_tokens, min=8, max=256, step=8, description="max tokens")
        self.live = widgets.HTML("")
        fig = go.Figure()
        fig.add_scatter(name=STREAMED_LINE, mode="lines", line={"color": "#1f77b4", "shape": "hv"})
        fig.add_scatter(name=BUFFERED_LINE, mode="lines", line={"color": "#d62728", "shape": "hv"})
        fig.update_xaxes(title_text="seconds since the request was sent", rangemode="tozero")
        fig.update_yaxes(title_text="tokens the reader can see", rangemode="tozero")
        style(fig, "What the reader sees, streamed or not", measured_on(engine.model), height=380)
        self.figure = fig
        super().__init__([self.prompt, self.max_tokens], [fig], rows=[self.live])

    def _show_live(self, text: str) -> None:
        self.live.value = f"<pre style='white-space:pre-wrap;margin:0'>{html.escape(text)}▌</pre>"

    def measure(self) -> StreamRun:
        self.progress(0, 1, "streaming")
        run = stream_vs_buffered(self.engine, self.prompt.value, self.max_tokens.value, rounds=self.rounds,
                                 on_text=self._show_live)
        self.live.value = self.live.value.replace("▌", "")
        self.progress.finish(f"{run.tokens} tokens streamed, then {self.rounds} rounds of streamed and unstreamed "
                             "in alternating order")
        return run

    def draw(self) -> None:
        run: StreamRun = self.result
        with self.figure.batch_update():
            set_trace(self.figure, STREAMED_LINE, x=[0.0, *run.arrivals["seconds"]],
                      y=[0, *run.arrivals["tokens_seen"]])
            end = max(run.buffered_total_s, run.streamed_total_s)
            set_trace(self.figure, BUFFERED_LINE, x=[0.0, run.buffered_total_s, end], y=[0, run.tokens, run.tokens])
        self.status.value = (
            f"Streamed, the first token was on screen after <b>{run.ttft_s * 1e3:.0f} ms</b> and all {run.tokens} "
            f"after {run.streamed_total_s:.2f} s; unstreamed, the reader sees nothing for "
            f"<b>{run.buffered_total_s:.2f} s</b> and then everything (fastest of {self.rounds} alternating rounds "
            f"each: streamed/buffered total <b>{run.total_ratio:.2f}x</b>). The uncounted first run, on the fresh "
            f"engine and into the text box above, took {run.cold_total_s:.2f} s: first token "
            f"{run.cold_prefill_extra_s * 1e3:+,.0f} ms against the timed rounds, {run.cold_display_s * 1e3:,.0f} ms "
            f"in the text box. Same text every run: {run.same_text}.<br><i>{html.escape(run.text)}</i>")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        run: StreamRun = self.result
        arrivals = run.arrivals
        table = pd.DataFrame({"ms since sent": arrivals["seconds"] * 1e3, "tokens on screen": arrivals["tokens_seen"],
                              "new text": arrivals["new_text"].map(repr)})
        rounds = run.rounds.assign(total_s=run.rounds["total_s"], ttft_ms=run.rounds["ttft_s"] * 1e3).drop(
            columns="ttft_s")
        return [("Token arrival times, streamed (first 12 deltas)", table.head(12)),
                ("Every timed run, in order (after one uncounted run)", rounds)]
