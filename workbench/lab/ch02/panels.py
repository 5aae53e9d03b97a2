"""Chapter 2's engine panels: the KV cache toggled live on the real engine.

``CacheVsNoCacheLab`` (per-step time with and without a cache), ``PagedMemoryLab`` (contiguous max-length
reservations vs paged blocks on a mixed workload, with the block tables replayed step by step) and
``PrefixCacheLab`` (TTFT per request with a shared system prompt: layout and caching toggles). The runs are in
`workbench.lab.ch02.runs`; this module turns controls into runs and runs into figures.
"""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.lab.ch02.block_view import BlockView
from workbench.lab.ch02.runs import (
    LAYOUTS,
    WITH_CACHE,
    WITHOUT_CACHE,
    CacheComparison,
    PagedTrace,
    PrefixRun,
    cache_vs_no_cache,
    prefix_cache_run,
    trace_paged_run,
)
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import MiB, fmt_bytes, measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.workloads import WorkloadRequest, mixed_lengths

HIT, MISS = "#2ca02c", "#d62728"


class CacheVsNoCacheLab(LabPanel):
    """Time of every generation step against the context length, with and without the KV cache."""

    def __init__(self, model, tokenizer, *, context_tokens: int = 48, max_tokens: int = 24):
        self.model, self.tokenizer = model, tokenizer
        self.context = widgets.Dropdown(options=[24, 48, 96, 192], value=context_tokens,
                                        description="instructions", style={"description_width": "initial"})
        self.max_tokens = widgets.IntSlider(value=max_tokens, min=8, max=64, step=8, description="new tokens")
        fig = go.Figure()
        for name, color in ((WITH_CACHE, HIT), (WITHOUT_CACHE, MISS)):
            fig.add_scatter(name=name, mode="lines+markers", line={"color": color})
        fig.update_xaxes(title_text="tokens in the context when the token was produced")
        fig.update_yaxes(title_text="step time (ms)", rangemode="tozero")
        style(fig, "Each new token: recompute everything, or read the cache", measured_on(model))
        self.figure = fig
        super().__init__([self.context, self.max_tokens], [fig])

    def measure(self) -> CacheComparison:
        return cache_vs_no_cache(self.model, self.tokenizer, context_tokens=self.context.value,
                                 max_tokens=self.max_tokens.value, progress=self.progress)

    def same_work(self) -> list[tuple[str, float, float]]:
        """Both modes start with the same warmed-up prefill of the same prompt: timings far apart mean the
        machine was busy (the newcomer's busy run: 1,621 against 4,918 ms)."""
        result = self.result
        return [(f"the prefill of {result.prompt_tokens} tokens", result.ttft_ms(WITH_CACHE) / 1e3,
                 result.ttft_ms(WITHOUT_CACHE) / 1e3)]

    def draw(self) -> None:
        result = self.result
        steps = result.steps
        with self.figure.batch_update():
            for mode in (WITH_CACHE, WITHOUT_CACHE):
                rows = steps[(steps["mode"] == mode) & (steps["token_index"] > 0)]  # index 0 is prefill
                set_trace(self.figure, mode, x=rows["context_tokens"], y=rows["step_ms"])
        self.status.value = (f"decode: <b>{result.cached_tokens_per_s:.1f} tokens/s</b> with the cache, "
                             f"<b>{result.recompute_tokens_per_s:.1f} tokens/s</b> without ({result.speedup:.1f}x); "
                             f"the first token, the same prefill of {result.prompt_tokens} tokens in both modes "
                             f"(both warmed up): {result.ttft_ms(WITH_CACHE):.0f} vs "
                             f"{result.ttft_ms(WITHOUT_CACHE):.0f} ms; identical greedy tokens: "
                             f"<b>{result.same_tokens}</b>")


DEFAULT_WORKLOAD_SIZE = 12
CONTIGUOUS, PAGED, STORED = "contiguous: reserved (running × max_len)", "paged: blocks held", "tokens actually stored"


def default_paged_workload() -> list[WorkloadRequest]:
    """Twelve requests, prompts of 16-160 tokens and 4-64 output tokens (log-uniform: many short, few long)."""
    return mixed_lengths(DEFAULT_WORKLOAD_SIZE, prompt_tokens=(16, 160), output_tokens=(4, 64), seed=0)


class PagedMemoryLab(LabPanel):
    """Reserved vs used KV memory over a run, and the block pool replayed step by step."""

    def __init__(self, model, tokenizer, *, workload: list[WorkloadRequest] | None = None, block_size: int = 16,
                 max_len: int = 2048, pool_tokens: int = 1536, max_num_seqs: int = 4):
        self.model, self.tokenizer = model, tokenizer
        self.workload = workload or default_paged_workload()
        self.pool_tokens, self.max_num_seqs = pool_tokens, max_num_seqs
        self.block_size = widgets.Dropdown(options=[4, 8, 16, 32, 64, 128], value=block_size,
                                           description="block size")
        self.max_len = widgets.Dropdown(options=[256, 512, 2048, 8192], value=max_len,
                                        description="contiguous max_len", style={"description_width": "initial"})
        fig = go.Figure()
        for name, color, fill in ((CONTIGUOUS, "#7f7f7f", "tozeroy"), (PAGED, "#1f77b4", "tozeroy"),
                                  (STORED, "#2ca02c", None)):
            fig.add_scatter(name=name, mode="lines", line={"color": color, "shape": "hv"}, fill=fill)
        fig.update_xaxes(title_text="engine step")
        fig.update_yaxes(title_text="KV memory (MiB)", rangemode="tozero")
        style(fig, "KV memory over a mixed workload", measured_on(model))
        self.figure = fig
        self.view = BlockView(len(self.workload))
        super().__init__([self.block_size], [fig, self.view.figure], rows=[self.view.controls],
                         redraw_only=[self.max_len])
        self.view.step.observe(lambda _c: self._changed(self._show_step), names="value")

    def measure(self) -> PagedTrace:
        trace = trace_paged_run(self.model, self.tokenizer, self.workload, block_size=self.block_size.value,
                                pool_tokens=self.pool_tokens, max_num_seqs=self.max_num_seqs, progress=self.progress)
        self.progress.finish(f"{len(trace.timeline)} steps, {len(self.workload)} requests")
        return trace

    @property
    def totals(self) -> dict[str, float]:
        """Paged against contiguous (the ``max_len`` control) for the finished requests' final lengths."""
        return self.result.totals(self.max_len.value)

    def draw(self) -> None:
        trace, max_len = self.result, self.max_len.value
        line = trace.timeline
        contiguous = trace.contiguous_bytes(max_len)
        with self.figure.batch_update():
            for name, values in ((CONTIGUOUS, contiguous), (PAGED, line["held_bytes"]), (STORED, line["used_bytes"])):
                set_trace(self.figure, name, x=line["step"], y=values / MiB)
            self.figure.layout.title.text = (f"KV memory over {len(self.workload)} mixed requests: block size "
                                             f"{trace.block_size}, contiguous max_len {max_len:,}")
        self._holding = True  # moving the step slider to the peak must not publish a half-drawn panel
        try:
            self.view.show(trace, int(line["held_bytes"].idxmax()))
        finally:
            self._holding = False
        totals = self.totals
        self.status.value = (
            f"Averaged over the run, paged blocks held <b>{fmt_bytes(line['held_bytes'].mean())}</b> against "
            f"<b>{fmt_bytes(contiguous.mean())}</b> reserved contiguously: <b>{trace.saving(max_len):.0%} saved</b>. "
            f"Per request (final lengths): paged wastes {totals['paged_waste']:.1%} in partly filled last blocks, "
            f"contiguous wastes {totals['contiguous_waste']:.1%}.")
        self._mark_step()

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [(self.view.tables_caption(), self.view.table_frame())]

    def _show_step(self) -> None:
        self.view.draw()
        self._mark_step()
        self.publish()

    def _mark_step(self) -> None:
        step = self.view.step.value
        with self.figure.batch_update():
            self.figure.layout.shapes = [{"type": "line", "x0": step, "x1": step, "xref": "x", "y0": 0, "y1": 1,
                                          "yref": "paper", "line": {"color": "black", "dash": "dot"}}]


TTFT, LATER, FIRST = "TTFT", "median TTFT, requests after the first", "first request"


def prefix_status(run: PrefixRun) -> str:
    """The prefix panel's status line. Without a single hit (dynamic part first, caching off) there is no hit
    time to show: the line then compares the later requests with the first, cold one instead."""
    rates = (f"token hit rate <b>{run.hit_rate:.0%}</b> over all {len(run.frame)} requests, "
             f"<b>{run.warm_hit_rate:.0%}</b> without the first, cold one")
    if run.hits:
        return (f"median TTFT: miss <b>{run.miss_ms:.0f} ms</b>, hit <b>{run.hit_ms:.0f} ms</b> "
                f"({run.miss_ms / run.hit_ms:.1f}x faster); " + rates)
    return (f"no request hit the cache: median TTFT <b>{run.later_median_ms:.0f} ms</b> after the first request "
            f"(first, cold one {run.first_ms:.0f} ms), every prompt computed in full; " + rates)


class PrefixCacheLab(LabPanel):
    """TTFT of each request sharing standing instructions; every configuration run is kept for comparison."""

    def __init__(self, model, tokenizer, *, static_tokens: int = 500, num_requests: int = 6):
        self.model, self.tokenizer, self.num_requests = model, tokenizer, num_requests
        self.static_tokens = widgets.Dropdown(options=[250, 500, 1000], value=static_tokens,
                                              description="shared prefix", style={"description_width": "initial"})
        self.layout_choice = widgets.ToggleButtons(options=LAYOUTS, value=LAYOUTS[0], description="layout")
        self.caching = widgets.ToggleButtons(options=[("on", True), ("off", False)], value=True,
                                             description="prefix cache")
        fig = go.Figure()
        fig.add_bar(name=TTFT, textposition="outside")
        fig.update_xaxes(title_text="request (sent one at a time)")
        fig.update_yaxes(title_text="time to first token (ms)", rangemode="tozero")
        style(fig, "TTFT per request", measured_on(model))
        history = go.Figure()
        for name, color in ((LATER, "#1f77b4"), (FIRST, "#7f7f7f")):
            history.add_bar(name=name, marker_color=color)
        history.update_yaxes(title_text="ms")
        style(history, "Every configuration run so far", measured_on(model), height=360)
        self.figure, self.history_figure = fig, history
        self.history: list[PrefixRun] = []
        super().__init__([self.static_tokens, self.layout_choice, self.caching], [fig, history])

    def measure(self) -> PrefixRun:
        run = prefix_cache_run(self.model, self.tokenizer, static_tokens=self.static_tokens.value,
                               layout=self.layout_choice.value, caching=self.caching.value,
                               num_requests=self.num_requests, progress=self.progress)
        self.history.append(run)
        return run

    def draw(self) -> None:
        run = self.result
        frame = run.frame
        with self.figure.batch_update():
            set_trace(self.figure, TTFT, x=frame["request"], y=frame["ttft_ms"],
                      marker_color=[HIT if h else MISS for h in frame["hit"]],
                      text=[f"{c}/{p} cached" for c, p in zip(frame["cached_tokens"], frame["prompt_tokens"],
                                                              strict=True)])
            self.figure.layout.title.text = (f"TTFT per request: {run.config} (green = prefix-cache hit), token hit "
                                             f"rate {run.hit_rate:.0%}")
        names = [h.config for h in self.history]
        with self.history_figure.batch_update():
            set_trace(self.history_figure, LATER, x=names, y=[h.later_median_ms for h in self.history])
            set_trace(self.history_figure, FIRST, x=names, y=[h.first_ms for h in self.history])
        self.status.value = prefix_status(run)
