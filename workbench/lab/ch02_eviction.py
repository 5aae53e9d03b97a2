"""Chapter 2's eviction panel: prefix-cache hit rate against the cache budget, measured on the engine (LRU), with
LFU set beside it by replaying the same request stream through `workbench.lab.ch02_policy_sim`.

The first figure is the engine's sweep plus the simulator's LRU and LFU on the same stream (the simulator's
LRU must land on the engine's points, which is the check that its LFU is comparable). The second runs both
policies over a longer stream, a skewed one and one whose hot prefixes go cold halfway, where the simulator
alone is fast enough: it shows when LFU helps and when it hurts.
"""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.lab.ch02_policy_sim import policy_sweep
from workbench.lab.common import LabPanel, measured_on, style
from workbench.lab.kv_runs import PATTERNS, eviction_prompts, eviction_sweep

HIT, LFU_COLOR, SIM_COLOR = "#2ca02c", "#ff7f0e", "#7f7f7f"
LONG_STREAM = 200  # requests: long enough for use counts to separate the policies, instant in the simulator
LONG_PATTERNS = ("skewed (Zipf)", "shifting hot set")


class EvictionLab(LabPanel):
    """Hit rate against cache budget: the engine's LRU, and LRU vs LFU replayed on the same stream."""

    def __init__(self, model, tokenizer, *, num_prefixes: int = 4, num_requests: int = 24, prefix_tokens: int = 64,
                 block_size: int = 16, pattern: str = PATTERNS[0]):
        self.model, self.tokenizer = model, tokenizer
        self.num_requests, self.prefix_tokens, self.block_size = num_requests, prefix_tokens, block_size
        self.pattern = widgets.ToggleButtons(options=PATTERNS, value=pattern, description="access")
        self.num_prefixes = widgets.IntSlider(value=num_prefixes, min=2, max=8, description="prefixes")
        fig = go.Figure()
        fig.add_scatter(name="engine (LRU): token hit rate", mode="lines+markers", line={"color": HIT, "width": 3})
        fig.add_scatter(name="engine (LRU): requests served from cache", mode="lines+markers",
                        line={"color": "#1f77b4", "dash": "dash"})
        fig.add_scatter(name="simulated LRU (same stream)", mode="markers",
                        marker={"color": SIM_COLOR, "symbol": "circle-open", "size": 12})
        fig.add_scatter(name="simulated LFU (same stream)", mode="lines+markers", line={"color": LFU_COLOR})
        fig.update_xaxes(title_text=f"cache budget (blocks of {block_size} tokens)")
        fig.update_yaxes(title_text="%", range=[0, 105])
        style(fig, "Hit rate against cache budget",
              measured_on(model) + " — hit rates depend on token ids only, not on weights")
        longer = go.Figure(make_subplots(rows=1, cols=2, subplot_titles=LONG_PATTERNS, horizontal_spacing=0.1))
        for col in (1, 2):
            for policy, color in (("LRU", HIT), ("LFU", LFU_COLOR)):
                longer.add_scatter(name=policy, mode="lines+markers", line={"color": color}, showlegend=col == 1,
                                   row=1, col=col)
        longer.update_xaxes(title_text="cache budget (blocks)")
        longer.update_yaxes(title_text="token hit rate (%)", range=[0, 105])
        style(longer, f"LRU vs LFU over {LONG_STREAM} requests (simulated)",
              "block-level replay of the engine's prefix cache; its LRU matches the engine's measured points above",
              height=380)
        self.figure, self.long_figure = fig, longer
        self.frame = self.sim = self.long_sim = None
        super().__init__([self.pattern, self.num_prefixes], [fig, longer])
        self.refresh()

    @property
    def working_set(self) -> int:
        return self.num_prefixes.value * (self.prefix_tokens // self.block_size)

    def budgets(self) -> list[int]:
        working = self.working_set
        smallest = -(-(self.prefix_tokens + self.block_size // 2 + 1) // self.block_size)
        steps = [smallest, working // 4, working // 2, 3 * working // 4, working - 1, working, working + 2,
                 working * 3 // 2]
        return sorted({max(smallest, b) for b in steps})

    def _prompts(self, pattern: str, num_requests: int) -> list[list[int]]:
        return eviction_prompts(self.num_prefixes.value, num_requests, pattern, prefix_tokens=self.prefix_tokens,
                                block_size=self.block_size)

    def measure(self) -> None:
        budgets = self.budgets()
        self.frame = eviction_sweep(self.model, self.tokenizer, budgets, num_prefixes=self.num_prefixes.value,
                                    pattern=self.pattern.value, num_requests=self.num_requests,
                                    prefix_tokens=self.prefix_tokens, block_size=self.block_size,
                                    progress=self.progress)
        self.sim = policy_sweep(self._prompts(self.pattern.value, self.num_requests), budgets, self.block_size)
        self.long_sim = {p: policy_sweep(self._prompts(p, LONG_STREAM), budgets, self.block_size)
                         for p in LONG_PATTERNS}

    def policy_frame(self, sim: pd.DataFrame) -> pd.DataFrame:
        """Hit rate per budget (rows) and policy (columns)."""
        return sim.pivot(index="budget_blocks", columns="policy", values="hit_rate")

    def simulator_matches_engine(self) -> bool:
        lru = self.sim[self.sim["policy"] == "LRU"].reset_index(drop=True)
        engine = self.frame.reset_index(drop=True)
        return (lru["hit_rate"].equals(engine["hit_rate"])
                and lru["evicted_blocks"].equals(engine["evicted_blocks"]))

    def draw(self) -> None:
        frame, working = self.frame, self.working_set
        rates = self.policy_frame(self.sim)
        with self.figure.batch_update():
            self.figure.data[0].x, self.figure.data[0].y = frame["budget_blocks"], 100 * frame["hit_rate"]
            self.figure.data[1].x = frame["budget_blocks"]
            self.figure.data[1].y = 100 * frame["requests_hit"] / self.num_requests
            for trace, policy in zip(self.figure.data[2:], ("LRU", "LFU"), strict=True):
                trace.x, trace.y = rates.index, 100 * rates[policy]
            self.figure.layout.shapes = [{"type": "line", "x0": working, "x1": working, "y0": 0, "y1": 1,
                                          "yref": "paper", "line": {"color": "black", "dash": "dot"}}]
            self.figure.layout.title.text = (f"Hit rate against cache budget: {self.num_requests} requests over "
                                             f"{self.num_prefixes.value} shared prefixes, {self.pattern.value} "
                                             f"(dotted: working set {working} blocks)")
        with self.long_figure.batch_update():
            for i, pattern in enumerate(LONG_PATTERNS):
                long_rates = self.policy_frame(self.long_sim[pattern])
                for j, policy in enumerate(("LRU", "LFU")):
                    trace = self.long_figure.data[2 * i + j]
                    trace.x, trace.y = long_rates.index, 100 * long_rates[policy]
        gaps = self.policy_gaps()
        self.status.value = (
            f"{self.num_requests} requests over {self.num_prefixes.value} prefixes of {self.prefix_tokens} tokens; "
            f"working set {working} blocks. The engine's token hit rate goes from "
            f"<b>{frame['hit_rate'].min():.0%}</b> to <b>{frame['hit_rate'].max():.0%}</b> across budgets; the "
            f"simulator's LRU matches it exactly: <b>{self.simulator_matches_engine()}</b>. LFU minus LRU, at the "
            f"budget where they differ most: {gaps['same stream']:+.0%} on this stream, "
            + ", ".join(f"{gaps[p]:+.0%} {p}" for p in LONG_PATTERNS) + f" over {LONG_STREAM} requests.")

    def policy_gaps(self) -> dict[str, float]:
        """LFU's hit rate minus LRU's at the budget where the two differ most, per stream."""
        def largest(sim: pd.DataFrame) -> float:
            diff = self.policy_frame(sim)["LFU"] - self.policy_frame(sim)["LRU"]
            return float(diff.loc[diff.abs().idxmax()])
        return {"same stream": largest(self.sim), **{p: largest(s) for p, s in self.long_sim.items()}}
