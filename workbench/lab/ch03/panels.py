"""Chapter 3's price-table panels: the economics (provider, TTL, requests/day) and TTL expiry on a timeline.
The engine panels (prompt layout, multi-turn breakpoints, the minimum-length trap) are `panels_engine`; the
computations are `workbench.lab.ch03.economics`; these classes only tie controls to figures."""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.hosted.pricing import models
from workbench.lab.ch03.economics import RATES, TTL_CHOICES, Economics, TTLTimeline, daily_economics, ttl_timeline
from workbench.lab.kit.figures import set_trace, style, trace
from workbench.lab.kit.panel import LabPanel

READ, WRITE, PLAIN = "#2ca02c", "#ff7f0e", "#7f7f7f"
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

    @property
    def ttl_name(self) -> str:
        return TTL_CHOICES[self.choice.value[0]][self.ttl.value]

    def measure(self) -> Economics:
        provider, model = self.choice.value
        return daily_economics(provider, model, ttl=self.ttl_name, prefix_tokens=self.prefix.value,
                         requests_per_day=self.rate.value)

    def draw(self) -> None:
        e: Economics = self.result
        with self.figure.batch_update():
            set_trace(self.figure, "without caching", x=e.curve["rate"], y=e.curve["uncached_per_day"])
            set_trace(self.figure, "with caching", x=e.curve["rate"], y=e.curve["cached_per_day"])
            set_trace(self.figure, "chosen rate", x=[e.requests_per_day], y=[e.point["cached_per_day"]])
            self.figure.layout.title.text = (f"Daily input cost: {e.model}, TTL {e.ttl}, "
                                             f"{e.prefix_tokens:,} static tokens")
        p, (exact, whole) = e.point, e.break_even
        per_day = e.break_even_per_day
        daily = ("the prefix is under the model's minimum, so nothing is cached at any rate" if per_day is None
                 else "caching never costs more here (no write premium)" if per_day == 0
                 else f"with random arrivals caching is cheaper from about <b>{per_day:,.0f}</b> requests/day")
        self.status.value = (f"At <b>{e.requests_per_day:,}</b> requests/day the cache is alive for "
                             f"<b>{p['hit_rate']:.0%}</b> of requests: caching is <b>{e.comparison}</b>, "
                             f"<b>${p['cached_per_day']:,.2f}</b>/day with caching vs <b>${p['uncached_per_day']:,.2f}"
                             f"</b> without (saving <b>${p['saving_per_month']:,.0f}</b>/month). Caching pays from "
                             f"N* = <b>{exact:.3f}</b> requests per TTL window, i.e. {whole}; {daily}.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        cols = ["provider", "model", "ttl", "hit_rate", "uncached_per_day", "cached_per_day", "saving_per_month",
                "break_even_exact", "miss_cost_usd", "why no hits"]
        e = self.result
        return [(f"Every provider model at {e.requests_per_day:,} requests/day, {e.prefix_tokens:,} static tokens "
                 "(break_even_exact holds only for a prefix the model caches)", e.with_reasons()[cols].round(4))]


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

    def measure(self) -> TTLTimeline:
        return ttl_timeline(self.tokenizer, self.static_text, self.ttl.value)

    def draw(self) -> None:
        t: TTLTimeline = self.result
        f = t.frame
        xs: list = []
        for at, expiry in zip(f.time_s, f.expires_s, strict=True):
            xs += [at / 60, min(expiry, f.time_s.max() + 600) / 60, None]
        with self.figure.batch_update():
            set_trace(self.figure, "entry alive", x=xs, y=[1 if x is not None else None for x in xs])
            marks = trace(self.figure, "request")
            marks.x, marks.y = f.time_s / 60, np.zeros(len(f))
            marks.text = ["read" if r else "write" for r in f.read]
            marks.marker.color = [READ if r else WRITE for r in f.read]
        self.status.value = (f"TTL {t.ttl}: <b>{t.writes}</b> of {len(f)} requests write, {t.reads} read; the "
                             f"{len(f)} requests cost <b>${t.cost_usd:.4f}</b> vs ${t.uncached_usd:.4f} uncached.")
