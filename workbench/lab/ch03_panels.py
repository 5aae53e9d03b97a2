"""Chapter 3's panels: the economics (provider, TTL, requests/day), prompt layout, multi-turn breakpoints,
the minimum-length trap and TTL expiry on a timeline. Measurements live in `workbench.lab.ch03_runs` and
`workbench.hosted`; these classes only tie controls to figures."""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.hosted import AnthropicCache, Block, SimClock
from workbench.hosted.costs import break_even_requests, daily_costs, provider_table
from workbench.hosted.pricing import load_pricing, models
from workbench.lab.ch03_runs import (
    DEFAULT_MODEL,
    LAYOUTS,
    MULTI_TURN_VARIANTS,
    HostedBench,
    hit_rate,
    layout_body,
    multi_turn_run,
)
from workbench.lab.kit.figures import style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.workloads import static_instructions

READ, WRITE, PLAIN = "#2ca02c", "#ff7f0e", "#7f7f7f"
RATES = [10, 30, 100, 300, 1_000, 3_000, 10_000, 30_000, 100_000]
TTL_CHOICES = {"anthropic": {"default": "5m", "extended": "1h"}, "openai": {"default": "in_memory", "extended": "24h"},
               "gemini": {"default": "1h", "extended": "1h"}}
COMPUTED = "computed from the provider price table (datasets/hosted/pricing.json)"


def _pairs() -> list[tuple[str, tuple[str, str]]]:
    return [(f"{p} · {m}", (p, m)) for p in ("anthropic", "openai", "gemini") for m in models(p)]


class EconomicsLab(LabPanel):
    """Daily cost with and without caching against requests per day, for one provider model and TTL."""

    def __init__(self, *, provider_model: tuple[str, str] = ("anthropic", "claude-sonnet-4-6"),
                 requests_per_day: int = 10_000, prefix_tokens: int = 4000):
        self.choice = widgets.Dropdown(options=_pairs(), value=provider_model, description="provider")
        self.ttl = widgets.ToggleButtons(options=["default", "extended"], value="default", description="TTL")
        self.rate = widgets.SelectionSlider(options=RATES, value=requests_per_day, description="requests/day")
        self.prefix = widgets.Dropdown(options=[1000, 2000, 4000, 8000], value=prefix_tokens,
                                       description="static tokens")
        fig = go.Figure()
        fig.add_scatter(name="without caching", mode="lines", line={"color": PLAIN})
        fig.add_scatter(name="with caching", mode="lines", line={"color": READ})
        fig.add_scatter(name="chosen rate", mode="markers", marker={"size": 12, "color": "black"})
        fig.update_xaxes(type="log", title_text="requests per day (Poisson arrivals)")
        fig.update_yaxes(type="log", title_text="input cost per day (USD)")
        self.figure = style(fig, "Daily input cost", COMPUTED)
        super().__init__([self.choice, self.ttl, self.rate, self.prefix], [fig])
        self.refresh()

    @property
    def ttl_name(self) -> str:
        return TTL_CHOICES[self.choice.value[0]][self.ttl.value]

    def measure(self) -> None:
        provider, model = self.choice.value
        self.curve = pd.DataFrame([daily_costs(provider, model, prefix_tokens=self.prefix.value,
                                               requests_per_day=r, ttl=self.ttl_name) | {"rate": r} for r in RATES])
        self.point = daily_costs(provider, model, prefix_tokens=self.prefix.value, requests_per_day=self.rate.value,
                                 ttl=self.ttl_name)
        self.break_even = break_even_requests(provider, model, self.ttl_name)
        self.table = provider_table(prefix_tokens=self.prefix.value, requests_per_day=self.rate.value)

    def draw(self) -> None:
        with self.figure.batch_update():
            self.figure.data[0].x = self.figure.data[1].x = self.curve["rate"]
            self.figure.data[0].y, self.figure.data[1].y = self.curve["uncached_per_day"], self.curve["cached_per_day"]
            self.figure.data[2].x, self.figure.data[2].y = [self.rate.value], [self.point["cached_per_day"]]
            self.figure.layout.title.text = (f"Daily input cost: {self.choice.value[1]}, TTL {self.ttl_name}, "
                                             f"{self.prefix.value:,} static tokens")
        p, (exact, whole) = self.point, self.break_even
        self.status.value = (f"At <b>{self.rate.value:,}</b> requests/day the cache is alive for <b>{p['hit_rate']:.0%}"
                             f"</b> of requests: <b>${p['cached_per_day']:,.2f}</b>/day with caching vs "
                             f"<b>${p['uncached_per_day']:,.2f}</b> without (saving <b>${p['saving_per_month']:,.0f}"
                             f"</b>/month). Caching pays from N* = <b>{exact:.3f}</b> requests per TTL window, i.e. "
                             f"{whole}.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        cols = ["provider", "model", "ttl", "hit_rate", "uncached_per_day", "cached_per_day", "saving_per_month",
                "break_even_exact", "miss_cost_usd"]
        return [(f"Every provider model at {self.rate.value:,} requests/day, {self.prefix.value:,} static tokens",
                 self.table[cols].round(4))]


class LayoutLab(LabPanel):
    """Static text first, or a timestamp / user id on top: provider cache reads and measured TTFT."""

    def __init__(self, bench: HostedBench, *, num_requests: int = 4):
        self.bench, self.num_requests = bench, num_requests
        self.layout_choice = widgets.ToggleButtons(options=LAYOUTS, value=LAYOUTS[0], description="layout")
        fig = go.Figure()
        fig.add_bar(name="TTFT (green: provider cache read, orange: write, grey: none)", textposition="outside")
        fig.update_xaxes(title_text="request (one at a time, each 10 simulated s after the previous first token)")
        fig.update_yaxes(title_text="time to first token (ms)", rangemode="tozero")
        self.figure = style(fig, "TTFT per request", measured_on(bench.model))
        self.runs: dict[str, pd.DataFrame] = {}
        super().__init__([self.layout_choice], [fig])
        self.refresh()

    def measure(self) -> None:
        self.frame = self.bench.layout_run(self.layout_choice.value, num_requests=self.num_requests,
                                           progress=self.progress)
        self.runs[self.layout_choice.value] = self.frame
        self.progress.finish("done")

    def summary(self) -> dict[str, float]:
        f = self.frame
        reads, misses = f.loc[f.cache_read > 0, "ttft_ms"], f.loc[f.cache_read == 0, "ttft_ms"]
        return {"hit_rate": hit_rate(f), "hit_ms": reads.median() if len(reads) else float("nan"),
                "miss_ms": misses.median(), "cost_usd": f.cost_usd.sum(), "engine_cached": f.engine_cached.sum()}

    def draw(self) -> None:
        f = self.frame
        colors = [READ if r else WRITE if w else PLAIN for r, w in zip(f.cache_read, f.cache_write, strict=True)]
        with self.figure.batch_update():
            bar = self.figure.data[0]
            bar.x, bar.y, bar.marker.color = f.request, f.ttft_ms, colors
            bar.text = [f"read {r} / write {w}" for r, w in zip(f.cache_read, f.cache_write, strict=True)]
            self.figure.layout.title.text = f"TTFT per request, layout: {self.layout_choice.value}"
        s = self.summary()
        hit = "no request read the cache" if s["hit_ms"] != s["hit_ms"] else f"hits <b>{s['hit_ms']:.0f} ms</b>"
        self.status.value = (f"<b>{self.layout_choice.value}</b>: provider cache reads cover <b>{s['hit_rate']:.0%}"
                             f"</b> of prompt tokens; median TTFT misses <b>{s['miss_ms']:.0f} ms</b>, {hit}; "
                             f"the {len(f)} requests cost ${s['cost_usd']:.5f} at {DEFAULT_MODEL} prices.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        cols = ["request", "prompt_tokens", "input_tokens", "cache_write", "cache_read", "engine_cached", "ttft_ms"]
        return [("Usage fields per request (emulated provider) and the engine's own cache hits",
                 self.frame[cols].round(1))]


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
        self.refresh()

    def measure(self) -> None:
        self.frame = multi_turn_run(self.bench, turns=self.turns.value, progress=self.progress)
        self.progress.finish("done")

    def shares(self) -> dict[str, float]:
        """Cache reads over prompt tokens on the turns after the first, per breakpoint placement."""
        later = self.frame[self.frame.request > 0]
        return {name: hit_rate(later[later.variant == name]) for name in MULTI_TURN_VARIANTS}

    def draw(self) -> None:
        f = self.frame
        with self.figure.batch_update():
            for trace, name in zip(self.figure.data, MULTI_TURN_VARIANTS, strict=True):
                part = f[f.variant == name]
                trace.x, trace.y = part.request + 1, part.cache_read / part.prompt_tokens
        s, costs = self.shares(), f.groupby("variant").cost_usd.sum()
        moving, fixed = MULTI_TURN_VARIANTS
        self.status.value = (f"After turn 1, the moving breakpoint reads <b>{s[moving]:.0%}</b> of each prompt from "
                             f"cache, the system-only breakpoint <b>{s[fixed]:.0%}</b>; the conversation costs "
                             f"${costs[moving]:.5f} vs ${costs[fixed]:.5f}. The engine's TTFT is the same for "
                             "both: it reuses the whole history either way; only the bill differs.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        cols = ["request", "variant", "prompt_tokens", "input_tokens", "cache_write", "cache_read", "ttft_ms"]
        return [("Usage per turn and placement", self.frame[cols].round(1))]


class MinimumLab(LabPanel):
    """Two identical requests of a chosen length: what the engine reuses vs what the provider bills as cached."""

    def __init__(self, bench: HostedBench, *, prompt_tokens: int = 300):
        self.bench = bench
        self.length = widgets.Dropdown(options=[300, 1100, 2100], value=prompt_tokens, description="static tokens")
        self.model_choice = widgets.Dropdown(options=models("anthropic"), value=DEFAULT_MODEL, description="model")
        fig = go.Figure()
        fig.add_bar(name="engine prefix cache (really skipped)", marker_color="#1f77b4")
        fig.add_bar(name="provider cache_read_input_tokens (billed as cached)", marker_color=READ)
        fig.update_yaxes(title_text="tokens of request 2")
        self.figure = style(fig, "Second identical request", measured_on(bench.model))
        super().__init__([self.length, self.model_choice], [fig])
        self.refresh()

    def measure(self) -> None:
        static = static_instructions(self.bench.tokenizer, self.length.value)
        body = layout_body(static, "static first", 0, "Which rule covers lost cards?", self.model_choice.value)
        self.frame = self.bench.repeated([body, body])
        self.minimum = AnthropicCache(self.model_choice.value).min_tokens

    def draw(self) -> None:
        second = self.frame.iloc[1]
        with self.figure.batch_update():
            self.figure.data[0].x = self.figure.data[1].x = [f"{int(second.prompt_tokens)}-token prompt"]
            self.figure.data[0].y, self.figure.data[1].y = [second.engine_cached], [second.cache_read]
        verdict = "is cached" if second.cache_read else "is <b>not</b> cached (no error, no cache tokens)"
        self.status.value = (f"A {int(second.prompt_tokens)}-token prompt on {self.model_choice.value} (minimum "
                             f"{self.minimum:,}) {verdict}: the provider bills {int(second.cache_read)} cached "
                             f"tokens while the engine reused {int(second.engine_cached)}.")


TIMELINE_S = [0, 120, 240, 500, 560, 1500, 1520, 2400, 4000, 4100]


class TTLLab(LabPanel):
    """Requests on a simulated clock: which ones write, which read, and when the entry expires."""

    def __init__(self, tokenizer, static_text: str, *, ttl: str = "5m"):
        self.tokenizer, self.static_text = tokenizer, static_text
        self.ttl = widgets.ToggleButtons(options=["5m", "1h"], value=ttl, description="TTL")
        fig = go.Figure()
        fig.add_scatter(name="entry alive", mode="lines", line={"color": READ, "width": 6})
        fig.add_scatter(name="request", mode="markers+text", textposition="top center", marker={"size": 12})
        fig.update_xaxes(title_text="simulated time (minutes)")
        fig.update_yaxes(visible=False, range=[-0.5, 1.5])
        self.figure = style(fig, "TTL timeline", COMPUTED, height=320)
        super().__init__([self.ttl], [fig])
        self.refresh()

    def measure(self) -> None:
        clock = SimClock()
        cache = AnthropicCache(DEFAULT_MODEL, clock=clock)
        ids = self.tokenizer.encode(self.static_text, add_special_tokens=False)
        prompt = [Block(tuple(ids), self.ttl.value), Block((1, 2, 3))]
        rows, alive = [], []
        for t in TIMELINE_S:
            clock.advance(t - clock())
            usage = cache.request(prompt, response_delay_s=1.0)
            expiry = max(e[2] for e in cache.live_entries())
            rows.append({"time_s": t, "write": usage.cache_creation_input_tokens, "read": usage.cache_read_input_tokens,
                         "cost_usd": usage.cost_usd(DEFAULT_MODEL), "expires_s": expiry})
            alive.append((t, expiry))
        self.frame = pd.DataFrame(rows)
        plain = AnthropicCache(DEFAULT_MODEL, min_cacheable_tokens=10**9, clock=SimClock()).request(prompt)
        self.uncached_usd = plain.cost_usd(DEFAULT_MODEL) * len(TIMELINE_S)

    def draw(self) -> None:
        f = self.frame
        xs: list = []
        for t, expiry in zip(f.time_s, f.expires_s, strict=True):
            xs += [t / 60, min(expiry, f.time_s.max() + 600) / 60, None]
        with self.figure.batch_update():
            self.figure.data[0].x, self.figure.data[0].y = xs, [1 if x is not None else None for x in xs]
            marks = self.figure.data[1]
            marks.x, marks.y = f.time_s / 60, np.zeros(len(f))
            marks.text = ["read" if r else "write" for r in f.read]
            marks.marker.color = [READ if r else WRITE for r in f.read]
        writes = int((f.read == 0).sum())
        self.status.value = (f"TTL {self.ttl.value}: <b>{writes}</b> of {len(f)} requests write, {len(f) - writes} "
                             f"read; the {len(f)} requests cost <b>${f.cost_usd.sum():.4f}</b> vs "
                             f"${self.uncached_usd:.4f} uncached.")


__all__ = ["EconomicsLab", "LayoutLab", "MinimumLab", "MultiTurnLab", "TTLLab", "load_pricing"]
