"""Chapter 7's tree panel: a chain of K drafts, a static tree and a dynamic tree of K nodes at the same
verification budget (K + 1 positions per target pass), tokens per pass measured beside the yield the independence
model expects at the acceptance each run measured, and what each pass cost (r) and gained (speedup)."""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.lab.ch07.trees import COLUMNS, TreeComparison, compare_trees
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel

MEASURED_YIELD, EXPECTED_YIELD, SPEEDUP = ("tokens per pass, measured", "tokens per pass, expected (independence "
                                           "model at the measured acceptance)", "speedup over plain decoding")
BREAK_EVEN = "speedup 1.0× (as fast as plain decoding)"


class TreeLab(LabPanel):
    """Chain vs static tree vs dynamic tree of ``budget`` nodes on held-out chat prompts, greedy, batch 1."""

    def __init__(self, model, tokenizer, draft, *, budget: int = 4, num_prompts: int = 2, max_tokens: int = 16):
        self.model, self.tokenizer, self.draft = model, tokenizer, draft
        self.budget = widgets.Dropdown(options=[4, 8], value=budget, description="nodes")
        self.num_prompts, self.max_tokens = num_prompts, max_tokens
        fig = go.Figure()
        fig.add_bar(name=MEASURED_YIELD, marker_color="#2ca02c", textposition="outside")
        fig.add_bar(name=EXPECTED_YIELD, marker_color="#98df8a")
        fig.add_scatter(name=SPEEDUP, mode="markers", marker={"symbol": "diamond", "size": 12, "color": "black"},
                        yaxis="y2")
        fig.add_scatter(name=BREAK_EVEN, mode="lines", line={"color": "black", "dash": "dot", "width": 1}, yaxis="y2")
        fig.update_layout(barmode="group", yaxis={"title": "tokens per target pass", "rangemode": "tozero"},
                          yaxis2={"title": "speedup over plain decoding (×)", "overlaying": "y", "side": "right",
                                  "rangemode": "tozero", "tickformat": ".1f", "dtick": 0.25})
        style(fig, "Chain vs token trees at the same verification budget", measured_on(model), height=380)
        self.figure = fig
        super().__init__([self.budget], [fig])

    def measure(self) -> TreeComparison:
        return compare_trees(self.model, self.tokenizer, self.draft, budget=self.budget.value,
                             num_prompts=self.num_prompts, max_tokens=self.max_tokens, progress=self.progress)

    def draw(self) -> None:
        result = self.result
        labels = [result.chain, *result.trees]
        rows = result.frame.loc[labels]
        with self.figure.batch_update():
            set_trace(self.figure, MEASURED_YIELD, x=labels, y=rows["tokens_per_pass"],
                      text=[f"{v:.2f}" for v in rows["tokens_per_pass"]])
            set_trace(self.figure, EXPECTED_YIELD, x=labels, y=rows["expected_tokens"])
            set_trace(self.figure, SPEEDUP, x=labels, y=rows["speedup"])
            set_trace(self.figure, BREAK_EVEN, x=labels, y=[1.0] * len(labels))
        self.status.value = (
            f"{result.sentence()}. Most tokens per pass: <b>{result.best_tree}</b>, {result.gain():.2f}x the "
            f"chain's; {'also' if result.faster_too else 'but not'} faster than the chain end to end here. "
            f"{result.yield_reading()}.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [("Per layout (r: a verifying forward over a plain decode step's; expected_from_probe: predicted "
                 f"from {self.result.probe}'s acceptance)", self.result.frame[COLUMNS].round(3))]
