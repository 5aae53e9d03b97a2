"""Chapter 2's eviction panels: prefix-cache hit rate against the cache budget, measured on the engine (LRU),
with LFU set beside it by replaying the same request stream through `workbench.lab.ch02.policy_sim`.

``EvictionLab`` draws the engine's sweep plus the simulator's LRU and LFU on the same stream (the simulator's
LRU must land on the engine's points, which is the check that its LFU is comparable). ``PolicyLab`` runs both
policies over longer streams, where the simulator alone is fast enough: a skewed one, and one whose hot
prefixes go cold halfway. It shows when LFU helps and when it hurts. The runs are `workbench.lab.ch02.eviction`.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.lab.ch02.eviction import (
    BLOCK_SIZE,
    LONG_PATTERNS,
    PATTERNS,
    PREFIX_TOKENS,
    EvictionSweep,
    PolicyComparison,
    eviction_run,
    policy_comparison,
    policy_frame,
)
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel

HIT, LFU_COLOR, SIM_COLOR = "#2ca02c", "#ff7f0e", "#7f7f7f"
ENGINE_TOKENS, ENGINE_REQUESTS = "engine (LRU): token hit rate", "engine (LRU): requests served from cache"
SIMULATED = {"LRU": "simulated LRU (same stream)", "LFU": "simulated LFU (same stream)"}


def policy_trace(pattern: str, policy: str) -> str:
    """Name of the PolicyLab trace of ``policy`` on the subplot of ``pattern``."""
    return f"{policy}, {pattern}"


class EvictionLab(LabPanel):
    """Hit rate against cache budget: the engine's LRU, and LRU vs LFU replayed on the same stream."""

    def __init__(self, model, tokenizer, *, num_prefixes: int = 4, num_requests: int = 24,
                 pattern: str = PATTERNS[0]):
        self.model, self.tokenizer, self.num_requests = model, tokenizer, num_requests
        self.pattern = widgets.ToggleButtons(options=PATTERNS, value=pattern, description="access")
        self.num_prefixes = widgets.IntSlider(value=num_prefixes, min=2, max=8, description="prefixes")
        fig = go.Figure()
        fig.add_scatter(name=ENGINE_TOKENS, mode="lines+markers", line={"color": HIT, "width": 3})
        fig.add_scatter(name=ENGINE_REQUESTS, mode="lines+markers", line={"color": "#1f77b4", "dash": "dash"})
        fig.add_scatter(name=SIMULATED["LRU"], mode="markers",
                        marker={"color": SIM_COLOR, "symbol": "circle-open", "size": 12})
        fig.add_scatter(name=SIMULATED["LFU"], mode="lines+markers", line={"color": LFU_COLOR})
        fig.update_xaxes(title_text=f"cache budget (blocks of {BLOCK_SIZE} tokens)")
        fig.update_yaxes(title_text="%", range=[0, 105])
        style(fig, "Hit rate against cache budget",
              measured_on(model) + " — hit rates depend on token ids only, not on weights")
        self.figure = fig
        super().__init__([self.pattern, self.num_prefixes], [fig])

    def measure(self) -> EvictionSweep:
        return eviction_run(self.model, self.tokenizer, num_prefixes=self.num_prefixes.value,
                            num_requests=self.num_requests, pattern=self.pattern.value, progress=self.progress)

    def draw(self) -> None:
        sweep = self.result
        frame, working, rates = sweep.frame, sweep.working_set, sweep.policy_rates
        with self.figure.batch_update():
            set_trace(self.figure, ENGINE_TOKENS, x=frame["budget_blocks"], y=100 * frame["hit_rate"])
            set_trace(self.figure, ENGINE_REQUESTS, x=frame["budget_blocks"],
                      y=100 * frame["requests_hit"] / sweep.num_requests)
            for policy, name in SIMULATED.items():
                set_trace(self.figure, name, x=rates.index, y=100 * rates[policy])
            self.figure.layout.shapes = [{"type": "line", "x0": working, "x1": working, "y0": 0, "y1": 1,
                                          "yref": "paper", "line": {"color": "black", "dash": "dot"}}]
            self.figure.layout.title.text = (f"Hit rate against cache budget: {sweep.num_requests} requests over "
                                             f"{sweep.num_prefixes} shared prefixes, {sweep.pattern} "
                                             f"(dotted: working set {working} blocks)")
        (gap,) = sweep.policy_gaps.values()
        self.status.value = (
            f"{sweep.num_requests} requests over {sweep.num_prefixes} prefixes of {PREFIX_TOKENS} tokens; "
            f"working set {working} blocks. The engine's token hit rate goes from "
            f"<b>{frame['hit_rate'].min():.0%}</b> to <b>{frame['hit_rate'].max():.0%}</b> across budgets; the "
            f"simulator's LRU matches it exactly: <b>{sweep.simulator_matches_engine}</b>. LFU minus LRU where "
            f"they differ most: <b>{100 * gap:+.0f} points</b>.")


class PolicyLab(LabPanel):
    """LRU vs LFU over longer simulated streams: a skewed one, and one whose hot set shifts halfway."""

    def __init__(self, *, num_prefixes: int = 5, num_requests: int = 200):
        self.num_prefixes = widgets.IntSlider(value=num_prefixes, min=2, max=8, description="prefixes")
        self.num_requests = widgets.Dropdown(options=[50, 200, 1000], value=num_requests, description="requests")
        fig = go.Figure(make_subplots(rows=1, cols=2, subplot_titles=LONG_PATTERNS, horizontal_spacing=0.1))
        for col, pattern in enumerate(LONG_PATTERNS, 1):
            for policy, color in (("LRU", HIT), ("LFU", LFU_COLOR)):
                fig.add_scatter(name=policy_trace(pattern, policy), legendgroup=policy, mode="lines+markers",
                                line={"color": color}, showlegend=col == 1, row=1, col=col)
        fig.update_xaxes(title_text="cache budget (blocks)")
        fig.update_yaxes(title_text="token hit rate (%)", range=[0, 105])
        style(fig, "LRU vs LFU (simulated)", "block-level replay of the engine's prefix cache, whose LRU it "
              "reproduces exactly; computed, no model runs", height=400)
        self.figure = fig
        super().__init__([self.num_prefixes, self.num_requests], [fig])

    def measure(self) -> PolicyComparison:
        return policy_comparison(self.num_prefixes.value, self.num_requests.value)

    def draw(self) -> None:
        result = self.result
        with self.figure.batch_update():
            for pattern in LONG_PATTERNS:
                rates = policy_frame(result.sims[pattern])
                for policy in ("LRU", "LFU"):
                    set_trace(self.figure, policy_trace(pattern, policy), x=rates.index, y=100 * rates[policy])
            self.figure.layout.title.text = (f"LRU vs LFU over {result.num_requests} requests and "
                                             f"{result.num_prefixes} shared prefixes (simulated)")
        self.status.value = (
            "LFU minus LRU where they differ most: " + ", ".join(
                f"<b>{100 * gap:+.0f} points</b> ({stream})" for stream, gap in result.policy_gaps.items())
            + ". Across budgets the hit rate itself moves by " + ", ".join(
                f"{100 * value:.0f} points ({p})" for p, value in result.budget_spreads.items()) + ".")
