"""Chapter 2's eviction panels: prefix-cache hit rate against the cache budget, measured on the engine (LRU),
with LFU set beside it by replaying the same request stream through `workbench.lab.ch02_policy_sim`.

``EvictionLab`` draws the engine's sweep plus the simulator's LRU and LFU on the same stream (the simulator's
LRU must land on the engine's points, which is the check that its LFU is comparable). ``PolicyLab`` runs both
policies over longer streams, where the simulator alone is fast enough: a skewed one, and one whose hot
prefixes go cold halfway. It shows when LFU helps and when it hurts.
"""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.lab.ch02_policy_sim import policy_sweep
from workbench.lab.kit.figures import style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.lab.kv_runs import PATTERNS, eviction_prompts, eviction_sweep

HIT, LFU_COLOR, SIM_COLOR = "#2ca02c", "#ff7f0e", "#7f7f7f"
LONG_PATTERNS = ("skewed (Zipf)", "shifting hot set")
PREFIX_TOKENS, BLOCK_SIZE = 64, 16


def budgets_for(num_prefixes: int, prefix_tokens: int = PREFIX_TOKENS, block_size: int = BLOCK_SIZE) -> list[int]:
    """Cache budgets (blocks) from barely one request to past the working set of ``num_prefixes`` prefixes."""
    working = num_prefixes * (prefix_tokens // block_size)
    smallest = -(-(prefix_tokens + block_size // 2 + 1) // block_size)
    steps = [smallest, working // 4, working // 2, 3 * working // 4, working - 1, working, working + 2,
             working * 3 // 2]
    return sorted({max(smallest, b) for b in steps})


def policy_frame(sim: pd.DataFrame) -> pd.DataFrame:
    """Hit rate per budget (rows) and policy (columns) of a `policy_sweep` result."""
    return sim.pivot(index="budget_blocks", columns="policy", values="hit_rate")


def largest_gap(sim: pd.DataFrame) -> float:
    """LFU's hit rate minus LRU's at the budget where the two differ most."""
    rates = policy_frame(sim)
    diff = rates["LFU"] - rates["LRU"]
    return float(diff.loc[diff.abs().idxmax()])


class EvictionLab(LabPanel):
    """Hit rate against cache budget: the engine's LRU, and LRU vs LFU replayed on the same stream."""

    def __init__(self, model, tokenizer, *, num_prefixes: int = 4, num_requests: int = 24,
                 pattern: str = PATTERNS[0]):
        self.model, self.tokenizer, self.num_requests = model, tokenizer, num_requests
        self.pattern = widgets.ToggleButtons(options=PATTERNS, value=pattern, description="access")
        self.num_prefixes = widgets.IntSlider(value=num_prefixes, min=2, max=8, description="prefixes")
        fig = go.Figure()
        fig.add_scatter(name="engine (LRU): token hit rate", mode="lines+markers", line={"color": HIT, "width": 3})
        fig.add_scatter(name="engine (LRU): requests served from cache", mode="lines+markers",
                        line={"color": "#1f77b4", "dash": "dash"})
        fig.add_scatter(name="simulated LRU (same stream)", mode="markers",
                        marker={"color": SIM_COLOR, "symbol": "circle-open", "size": 12})
        fig.add_scatter(name="simulated LFU (same stream)", mode="lines+markers", line={"color": LFU_COLOR})
        fig.update_xaxes(title_text=f"cache budget (blocks of {BLOCK_SIZE} tokens)")
        fig.update_yaxes(title_text="%", range=[0, 105])
        style(fig, "Hit rate against cache budget",
              measured_on(model) + " — hit rates depend on token ids only, not on weights")
        self.figure, self.frame, self.sim = fig, None, None
        super().__init__([self.pattern, self.num_prefixes], [fig])
        self.refresh()

    @property
    def working_set(self) -> int:
        return self.num_prefixes.value * (PREFIX_TOKENS // BLOCK_SIZE)

    def budgets(self) -> list[int]:
        return budgets_for(self.num_prefixes.value)

    def measure(self) -> None:
        budgets = self.budgets()
        self.frame = eviction_sweep(self.model, self.tokenizer, budgets, num_prefixes=self.num_prefixes.value,
                                    pattern=self.pattern.value, num_requests=self.num_requests,
                                    prefix_tokens=PREFIX_TOKENS, block_size=BLOCK_SIZE, progress=self.progress)
        prompts = eviction_prompts(self.num_prefixes.value, self.num_requests, self.pattern.value,
                                   prefix_tokens=PREFIX_TOKENS, block_size=BLOCK_SIZE)
        self.sim = policy_sweep(prompts, budgets, BLOCK_SIZE)

    def simulator_matches_engine(self) -> bool:
        lru = self.sim[self.sim["policy"] == "LRU"].reset_index(drop=True)
        engine = self.frame.reset_index(drop=True)
        return (lru["hit_rate"].equals(engine["hit_rate"])
                and lru["evicted_blocks"].equals(engine["evicted_blocks"]))

    def policy_rates(self) -> pd.DataFrame:
        """The simulator's hit rate per budget (rows) and policy (columns) on this panel's stream."""
        return policy_frame(self.sim)

    def policy_gaps(self) -> dict[str, float]:
        return {f"{self.pattern.value}, {self.num_requests} requests": largest_gap(self.sim)}

    def draw(self) -> None:
        frame, working = self.frame, self.working_set
        rates = self.policy_rates()
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
        self.status.value = (
            f"{self.num_requests} requests over {self.num_prefixes.value} prefixes of {PREFIX_TOKENS} tokens; "
            f"working set {working} blocks. The engine's token hit rate goes from "
            f"<b>{frame['hit_rate'].min():.0%}</b> to <b>{frame['hit_rate'].max():.0%}</b> across budgets; the "
            f"simulator's LRU matches it exactly: <b>{self.simulator_matches_engine()}</b>. LFU minus LRU where "
            f"they differ most: <b>{largest_gap(self.sim):+.0%}</b>.")


class PolicyLab(LabPanel):
    """LRU vs LFU over longer simulated streams: a skewed one, and one whose hot set shifts halfway."""

    def __init__(self, *, num_prefixes: int = 5, num_requests: int = 200):
        self.num_prefixes = widgets.IntSlider(value=num_prefixes, min=2, max=8, description="prefixes")
        self.num_requests = widgets.Dropdown(options=[50, 200, 1000], value=num_requests, description="requests")
        fig = go.Figure(make_subplots(rows=1, cols=2, subplot_titles=LONG_PATTERNS, horizontal_spacing=0.1))
        for col in (1, 2):
            for policy, color in (("LRU", HIT), ("LFU", LFU_COLOR)):
                fig.add_scatter(name=policy, mode="lines+markers", line={"color": color}, showlegend=col == 1,
                                row=1, col=col)
        fig.update_xaxes(title_text="cache budget (blocks)")
        fig.update_yaxes(title_text="token hit rate (%)", range=[0, 105])
        style(fig, "LRU vs LFU (simulated)", "block-level replay of the engine's prefix cache, whose LRU it "
              "reproduces exactly; computed, no model runs", height=400)
        self.figure, self.sims = fig, {}
        super().__init__([self.num_prefixes, self.num_requests], [fig])
        self.refresh()

    def measure(self) -> None:
        budgets = budgets_for(self.num_prefixes.value)
        self.sims = {p: policy_sweep(eviction_prompts(self.num_prefixes.value, self.num_requests.value, p,
                                                      prefix_tokens=PREFIX_TOKENS, block_size=BLOCK_SIZE),
                                     budgets, BLOCK_SIZE) for p in LONG_PATTERNS}

    def policy_gaps(self) -> dict[str, float]:
        return {f"{p}, {self.num_requests.value} requests": largest_gap(s) for p, s in self.sims.items()}

    def draw(self) -> None:
        with self.figure.batch_update():
            for i, pattern in enumerate(LONG_PATTERNS):
                rates = policy_frame(self.sims[pattern])
                for j, policy in enumerate(("LRU", "LFU")):
                    trace = self.figure.data[2 * i + j]
                    trace.x, trace.y = rates.index, 100 * rates[policy]
            self.figure.layout.title.text = (f"LRU vs LFU over {self.num_requests.value} requests and "
                                             f"{self.num_prefixes.value} shared prefixes (simulated)")
        spread = {p: float(policy_frame(s)["LRU"].max() - policy_frame(s)["LRU"].min()) for p, s in self.sims.items()}
        self.status.value = (
            "LFU minus LRU where they differ most: " + ", ".join(
                f"<b>{gap:+.0%}</b> {stream}" for stream, gap in self.policy_gaps().items())
            + ". Across budgets the hit rate itself moves by " + ", ".join(
                f"{value:.0%} ({p})" for p, value in spread.items()) + ".")
