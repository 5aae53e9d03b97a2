"""Chapter 3's engine panels: prompt layout (provider cache reads and measured TTFT), one conversation billed
with two breakpoint placements, and the minimum-length trap. The runs are `workbench.lab.ch03.runs`; these
classes only tie controls to figures."""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.hosted.pricing import models
from workbench.lab.ch03.bench import DEFAULT_MODEL, LAYOUTS, MULTI_TURN_VARIANTS, HostedBench
from workbench.lab.ch03.panels import READ, WRITE
from workbench.lab.ch03.runs import LayoutRun, MinimumRun, MultiTurnRun, layout_run, minimum_run, multi_turn_run
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel

PLAIN = "#7f7f7f"
TTFT_BAR = "TTFT (green: provider cache read, orange: write, grey: none)"


class LayoutLab(LabPanel):
    """Static text first, or a timestamp / user id on top: provider cache reads and measured TTFT."""

    def __init__(self, bench: HostedBench, *, num_requests: int = 4):
        self.bench, self.num_requests = bench, num_requests
        self.layout_choice = widgets.ToggleButtons(options=LAYOUTS, value=LAYOUTS[0], description="layout")
        fig = go.Figure()
        fig.add_bar(name=TTFT_BAR, textposition="outside")
        fig.update_xaxes(title_text="request (one at a time, each 10 simulated s after the previous first token; "
                                    "an unbilled warm-up request ran first and is not shown)")
        fig.update_yaxes(title_text="time to first token (ms)", rangemode="tozero")
        self.figure = style(fig, "TTFT per request", measured_on(bench.model))
        self.runs: dict[str, LayoutRun] = {}  # every layout measured so far, for the closing table
        super().__init__([self.layout_choice], [fig])

    def measure(self) -> LayoutRun:
        run = layout_run(self.bench, self.layout_choice.value, num_requests=self.num_requests,
                         progress=self.progress)
        self.runs[run.layout] = run
        self.progress.finish("done")
        return run

    def draw(self) -> None:
        run: LayoutRun = self.result
        f = run.frame
        colors = [READ if r else WRITE if w else PLAIN for r, w in zip(f.cache_read, f.cache_write, strict=True)]
        with self.figure.batch_update():
            set_trace(self.figure, TTFT_BAR, x=f.request + 1, y=f.ttft_ms, marker_color=colors,
                      text=[f"read {r} / write {w}" for r, w in zip(f.cache_read, f.cache_write, strict=True)])
            self.figure.layout.title.text = f"TTFT per request, layout: {run.layout}"
        hit = "no request read the cache" if run.hit_ms != run.hit_ms else f"hits <b>{run.hit_ms:.0f} ms</b>"
        self.status.value = (f"<b>{run.layout}</b>: provider cache reads cover <b>{run.hit_rate:.0%}</b> of prompt "
                             f"tokens over all {len(f)} requests, <b>{run.warm_hit_rate:.0%}</b> over the "
                             f"{len(f) - 1} after the first, cold one"
                             + ("" if run.ceiling != run.ceiling else f" (the most a warm request can read is "
                                f"{run.ceiling:.0%}: the prompt up to the breakpoint)") + "; "
                             f"median TTFT misses <b>{run.miss_ms:.0f} ms</b>, {hit} (a warm-up request "
                             f"of the same prompt ran first, unbilled, in {run.warmup_ttft_ms:.0f} ms: not counted); "
                             f"the {len(f)} requests cost ${run.cost_usd:.5f} at {run.model} prices.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        cols = ["request", "prompt_tokens", "input_tokens", "cache_write", "cache_read", "engine_cached", "ttft_ms"]
        return [("Usage fields per request (emulated provider) and the engine's own cache hits",
                 self.result.frame[cols].round(1))]


class MultiTurnLab(LabPanel):
    """One conversation, billed with the breakpoint on the last message vs on the system prompt only."""

    def __init__(self, bench: HostedBench, *, turns: int = 3):
        self.bench = bench
        self.turns = widgets.Dropdown(options=[3, 4, 6], value=turns, description="turns")
        fig = go.Figure()
        for name, color in zip(MULTI_TURN_VARIANTS, (READ, "#1f77b4"), strict=True):
            fig.add_bar(name=f"cache read: {name}", marker_color=color)
        fig.update_xaxes(title_text="turn")
        fig.update_yaxes(title_text="share of the prompt read from cache", tickformat=".0%", range=[0, 1])
        self.figure = style(fig, "Cache reads per turn", measured_on(bench.model))
        super().__init__([self.turns], [fig])

    def measure(self) -> MultiTurnRun:
        run = multi_turn_run(self.bench, turns=self.turns.value, progress=self.progress)
        self.progress.finish("done")
        return run

    def draw(self) -> None:
        run: MultiTurnRun = self.result
        f = run.frame
        with self.figure.batch_update():
            for name in MULTI_TURN_VARIANTS:
                part = f[f.variant == name]
                set_trace(self.figure, f"cache read: {name}", x=part.request + 1,
                          y=part.cache_read / part.prompt_tokens)
        s, costs = run.shares, run.costs
        moving, fixed = MULTI_TURN_VARIANTS
        self.status.value = (f"After turn 1, the moving breakpoint reads <b>{s[moving]:.0%}</b> of each prompt from "
                             f"cache, the system-only breakpoint <b>{s[fixed]:.0%}</b>; the conversation costs "
                             f"${costs[moving]:.5f} vs ${costs[fixed]:.5f}. The engine's TTFT is the same for "
                             "both: it reuses the whole history either way; only the bill differs.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        cols = ["request", "variant", "prompt_tokens", "input_tokens", "cache_write", "cache_read", "ttft_ms"]
        return [("Usage per turn and placement", self.result.frame[cols].round(1))]


ENGINE_BAR = "engine prefix cache (really skipped)"
PROVIDER_BAR = "provider cache_read_input_tokens (billed as cached)"


class MinimumLab(LabPanel):
    """Two identical requests of a chosen length: what the engine reuses vs what the provider bills as cached."""

    def __init__(self, bench: HostedBench, *, prompt_tokens: int = 300):
        self.bench = bench
        self.length = widgets.Dropdown(options=[300, 1100, 2100], value=prompt_tokens, description="static tokens")
        self.model_choice = widgets.Dropdown(options=models("anthropic"), value=DEFAULT_MODEL, description="model")
        fig = go.Figure()
        fig.add_bar(name=ENGINE_BAR, marker_color="#1f77b4")
        fig.add_bar(name=PROVIDER_BAR, marker_color=READ)
        fig.update_yaxes(title_text="tokens of request 2")
        self.figure = style(fig, "Second identical request", measured_on(bench.model))
        super().__init__([self.length, self.model_choice], [fig])

    def measure(self) -> MinimumRun:
        return minimum_run(self.bench, static_tokens=self.length.value, model=self.model_choice.value)

    def draw(self) -> None:
        run: MinimumRun = self.result
        label = [f"{run.prompt_tokens}-token prompt"]
        with self.figure.batch_update():
            set_trace(self.figure, ENGINE_BAR, x=label, y=[run.engine_reused])
            set_trace(self.figure, PROVIDER_BAR, x=label, y=[run.billed_cached])
        verdict = "is cached" if run.billed_cached else "is <b>not</b> cached (no error, no cache tokens)"
        self.status.value = (f"A {run.prompt_tokens}-token prompt on {run.model} (minimum {run.minimum:,}) "
                             f"{verdict}: the provider bills {run.billed_cached} cached tokens while the engine "
                             f"reused {run.engine_reused}.")
