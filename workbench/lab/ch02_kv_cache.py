"""Chapter 2 lab: the KV cache, toggled live on the real engine.

The notebook imports this module as ``ch02``; it gathers the chapter's panels, exercises and closing table.
Three panels live here: ``CacheVsNoCacheLab`` (per-step time with and without a cache), ``PagedMemoryLab``
(contiguous max-length reservations vs paged blocks on a mixed workload, with the block tables replayed step
by step) and ``PrefixCacheLab`` (TTFT per request with a shared system prompt: layout and caching toggles).
The others: ``KVShareLab`` and ``KVCapacityLab`` (what a GPU leaves the cache, `workbench.lab.ch02_capacity`),
``ParallelSamplingLab`` (copy-on-write forks, `workbench.lab.ch02_fork`), ``EvictionLab`` and ``PolicyLab``
(hit rate against the budget, LRU vs LFU, `workbench.lab.ch02_eviction`). Runs live in `workbench.lab.kv_runs`; this
module turns controls into runs and runs into figures.
"""

from __future__ import annotations

import statistics

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.cache.memory_compare import compare_reservations
from workbench.lab.block_view import BlockView
from workbench.lab.ch02_capacity import KVCapacityLab, KVShareLab
from workbench.lab.ch02_eviction import EvictionLab, PolicyLab
from workbench.lab.ch02_fork import ParallelSamplingLab
from workbench.lab.ch02_summary import EXERCISES, takeaways
from workbench.lab.kit.figures import style
from workbench.lab.kit.notebook import MiB, fmt_bytes, measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.lab.kv_runs import LAYOUTS, cache_vs_no_cache, prefix_cache_run, trace_paged_run
from workbench.workloads import WorkloadRequest, mixed_lengths

__all__ = ["EXERCISES", "CacheVsNoCacheLab", "EvictionLab", "KVCapacityLab", "KVShareLab", "PagedMemoryLab",
           "ParallelSamplingLab", "PolicyLab", "PrefixCacheLab", "takeaways"]

HIT, MISS = "#2ca02c", "#d62728"


class CacheVsNoCacheLab(LabPanel):
    """Time of every generation step against the context length, with and without the KV cache."""

    def __init__(self, model, tokenizer, *, context_tokens: int = 48, max_tokens: int = 24):
        self.model, self.tokenizer = model, tokenizer
        self.context = widgets.Dropdown(options=[24, 48, 96, 192], value=context_tokens,
                                        description="instructions", style={"description_width": "initial"})
        self.max_tokens = widgets.IntSlider(value=max_tokens, min=8, max=64, step=8, description="new tokens")
        fig = go.Figure()
        for name, color in (("with KV cache", HIT), ("without cache (recompute)", MISS)):
            fig.add_scatter(name=name, mode="lines+markers", line={"color": color})
        fig.update_xaxes(title_text="tokens in the context when the token was produced")
        fig.update_yaxes(title_text="step time (ms)", rangemode="tozero")
        style(fig, "Each new token: recompute everything, or read the cache", measured_on(model))
        self.figure, self.result = fig, None
        super().__init__([self.context, self.max_tokens], [fig])
        self.refresh()

    def measure(self) -> None:
        self.result = cache_vs_no_cache(self.model, self.tokenizer, context_tokens=self.context.value,
                                        max_tokens=self.max_tokens.value, progress=self.progress)

    def draw(self) -> None:
        steps, summary = self.result.steps, self.result.summary
        with self.figure.batch_update():
            for trace in self.figure.data:
                rows = steps[(steps["mode"] == trace.name) & (steps["token_index"] > 0)]  # index 0 is prefill
                trace.x, trace.y = rows["context_tokens"], rows["step_ms"]
        fast, slow = (summary.loc[m, "decode_tokens_per_s"] for m in summary.index)
        ttft_cached, ttft_recompute = summary["ttft_ms"]
        self.status.value = (f"decode: <b>{fast:.1f} tokens/s</b> with the cache, <b>{slow:.1f} tokens/s</b> "
                             f"without ({fast / slow:.1f}x); the first token, the same prefill of "
                             f"{int(summary['prompt_tokens'].iloc[0])} tokens in both modes (both warmed up): "
                             f"{ttft_cached:.0f} vs {ttft_recompute:.0f} ms; identical greedy tokens: "
                             f"<b>{self.result.same_tokens}</b>")


DEFAULT_WORKLOAD_SIZE = 12


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
        for name, color, fill in (("contiguous: reserved (running × max_len)", "#7f7f7f", "tozeroy"),
                                  ("paged: blocks held", "#1f77b4", "tozeroy"),
                                  ("tokens actually stored", "#2ca02c", None)):
            fig.add_scatter(name=name, mode="lines", line={"color": color, "shape": "hv"}, fill=fill)
        fig.update_xaxes(title_text="engine step")
        fig.update_yaxes(title_text="KV memory (MiB)", rangemode="tozero")
        style(fig, "KV memory over a mixed workload", measured_on(model))
        self.figure, self.trace, self.totals = fig, None, {}
        self.view = BlockView(len(self.workload))
        super().__init__([self.block_size], [fig, self.view.figure], rows=[self.view.controls],
                         redraw_only=[self.max_len])
        self.view.step.observe(lambda _c: self._changed(self._show_step), names="value")
        self.refresh()

    def measure(self) -> None:
        self.trace = trace_paged_run(self.model, self.tokenizer, self.workload, block_size=self.block_size.value,
                                     pool_tokens=self.pool_tokens, max_num_seqs=self.max_num_seqs,
                                     progress=self.progress)
        self.progress.finish(f"{len(self.trace.timeline)} steps, {len(self.workload)} requests")

    def draw(self) -> None:
        trace, max_len = self.trace, self.max_len.value
        line = trace.timeline
        lengths = list(zip(trace.requests["prompt_tokens"], trace.requests["output_tokens"], strict=True))
        frame = compare_reservations(lengths, bytes_per_token=trace.bytes_per_token,
                                     max_len=max(max_len, max(p + o for p, o in lengths)),
                                     block_size=trace.block_size)
        self.totals = frame.attrs["totals"]
        contiguous = line["running"] * max_len * trace.bytes_per_token
        with self.figure.batch_update():
            for data, values in zip(self.figure.data, (contiguous, line["held_bytes"], line["used_bytes"]),
                                    strict=True):
                data.x, data.y = line["step"], values / MiB
            self.figure.layout.title.text = (f"KV memory over {len(self.workload)} mixed requests: block size "
                                             f"{trace.block_size}, contiguous max_len {max_len:,}")
        self._holding = True  # moving the step slider to the peak must not publish a half-drawn panel
        try:
            self.view.show(trace, int(line["held_bytes"].idxmax()))
        finally:
            self._holding = False
        saving = 1 - line["held_bytes"].sum() / contiguous.sum()
        self.status.value = (
            f"Averaged over the run, paged blocks held <b>{fmt_bytes(line['held_bytes'].mean())}</b> against "
            f"<b>{fmt_bytes(contiguous.mean())}</b> reserved contiguously: <b>{saving:.0%} saved</b>. Per request "
            f"(final lengths): paged wastes {self.totals['paged_waste']:.1%} in partly filled last blocks, "
            f"contiguous wastes {self.totals['contiguous_waste']:.1%}.")
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
        fig.add_bar(name="TTFT", textposition="outside")
        fig.update_xaxes(title_text="request (sent one at a time)")
        fig.update_yaxes(title_text="time to first token (ms)", rangemode="tozero")
        style(fig, "TTFT per request", measured_on(model))
        history = go.Figure()
        for name, color in (("median TTFT, requests after the first", "#1f77b4"), ("first request", "#7f7f7f")):
            history.add_bar(name=name, marker_color=color)
        history.update_yaxes(title_text="ms")
        style(history, "Every configuration run so far", measured_on(model), height=360)
        self.figure, self.history_figure = fig, history
        self.frame, self.hit_rate, self.history = None, 0.0, []
        super().__init__([self.static_tokens, self.layout_choice, self.caching], [fig, history])
        self.refresh()

    def measure(self) -> None:
        self.frame, self.hit_rate = prefix_cache_run(
            self.model, self.tokenizer, static_tokens=self.static_tokens.value, layout=self.layout_choice.value,
            caching=self.caching.value, num_requests=self.num_requests, progress=self.progress)
        later = self.frame["ttft_ms"].iloc[1:]
        self.history.append({"config": f"{self.static_tokens.value} tok, {self.layout_choice.value}, cache "
                                       f"{'on' if self.caching.value else 'off'}",
                             "layout": self.layout_choice.value, "caching": self.caching.value,
                             "first_ms": self.frame["ttft_ms"].iloc[0], "later_median_ms": later.median(),
                             "hit_rate": self.hit_rate})

    def summary(self) -> dict[str, float]:
        """Median TTFT of the misses and of the hits (NaN where there are none), the token hit rate over all
        requests, and over the requests after the first, cold one (which has nothing to hit)."""
        frame = self.frame
        hits, misses = frame.loc[frame["hit"], "ttft_ms"], frame.loc[~frame["hit"], "ttft_ms"]
        med = lambda s: statistics.median(s) if len(s) else float("nan")  # noqa: E731
        warm = frame.iloc[1:]
        return {"miss_ms": med(misses), "hit_ms": med(hits), "hit_rate": self.hit_rate,
                "warm_hit_rate": warm["cached_tokens"].sum() / warm["prompt_tokens"].sum()}

    def draw(self) -> None:
        frame = self.frame
        with self.figure.batch_update():
            bar = self.figure.data[0]
            bar.x, bar.y = frame["request"], frame["ttft_ms"]
            bar.marker.color = [HIT if h else MISS for h in frame["hit"]]
            bar.text = [f"{c}/{p} cached" for c, p in zip(frame["cached_tokens"], frame["prompt_tokens"],
                                                          strict=True)]
            self.figure.layout.title.text = (f"TTFT per request: {self.history[-1]['config']} "
                                             f"(green = prefix-cache hit), token hit rate {self.hit_rate:.0%}")
        with self.history_figure.batch_update():
            names = [h["config"] for h in self.history]
            self.history_figure.data[0].x = names
            self.history_figure.data[0].y = [h["later_median_ms"] for h in self.history]
            self.history_figure.data[1].x, self.history_figure.data[1].y = names, [h["first_ms"] for h in self.history]
        s = self.summary()
        ratio = s["miss_ms"] / s["hit_ms"] if s["hit_ms"] == s["hit_ms"] else float("nan")
        self.status.value = (f"median TTFT: miss <b>{s['miss_ms']:.0f} ms</b>, hit <b>{s['hit_ms']:.0f} ms</b>"
                             f" ({ratio:.1f}x faster); token hit rate <b>{s['hit_rate']:.0%}</b> over all "
                             f"{len(self.frame)} requests, <b>{s['warm_hit_rate']:.0%}</b> without the first, cold "
                             "one")
