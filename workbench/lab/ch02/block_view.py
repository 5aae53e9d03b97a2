"""A replay of the paged KV cache's block pool, one engine step at a time.

Chapter 2's point about paging is easiest to see, not read: requests take blocks anywhere in the pool as they
grow, give them back when they finish, and a newcomer reuses them at once. This view draws the pool as a grid
(one cell per physical block, coloured by the request that owns it) and lists every running request's block
table for the step chosen on the slider; the Play button animates the run in the browser.
"""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.colors
import plotly.graph_objects as go

from workbench.lab.ch02.runs import PagedTrace
from workbench.lab.kit.figures import set_trace, style

COLUMNS = 32
POOL = "block pool"


def _discrete_scale(n: int) -> list[list]:
    """A colorscale giving each integer 0..n-1 its own flat colour (request ids must not blur together)."""
    palette = plotly.colors.qualitative.Dark24
    scale = []
    for i in range(n):
        color = palette[i % len(palette)]
        scale += [[i / n, color], [(i + 1) / n, color]]
    return scale


class BlockView:
    """Step slider + play button, the block-pool grid, and the block tables as a table."""

    def __init__(self, num_requests: int):
        self.num_requests = num_requests
        self.trace: PagedTrace | None = None
        self.play = widgets.Play(value=0, min=0, max=0, interval=300, description="replay")
        self.step = widgets.IntSlider(value=0, min=0, max=0, description="step")
        widgets.jslink((self.play, "value"), (self.step, "value"))
        self.controls = widgets.HBox([self.play, self.step])
        self.figure = go.Figure(go.Heatmap(
            name=POOL, colorscale=_discrete_scale(num_requests), zmin=-0.5, zmax=num_requests - 0.5, showscale=False,
            xgap=2, ygap=2, hovertemplate="%{customdata}<extra></extra>", texttemplate="%{text}",
            textfont={"size": 9}))
        self.figure.update_yaxes(autorange="reversed", showticklabels=False, title_text="physical blocks")
        self.figure.update_xaxes(showticklabels=False)
        self.figure.update_layout(plot_bgcolor="#eeeeee")
        style(self.figure, "Block pool", "one cell per physical KV block, coloured by the request holding it; "
              "grey = free", height=300)

    def show(self, trace: PagedTrace, step: int) -> None:
        """Switch to a new run and draw ``step``. The owner observes ``self.step`` to redraw when the slider moves."""
        self.trace = trace
        last = len(trace.tables) - 1
        self.play.max = self.step.max = last
        self.step.value = step
        self.draw()

    def grid(self, step: int) -> tuple[list[list], list[list[str]], list[list[str]]]:
        """Owner index, short label and hover text for every block of the pool at ``step``."""
        trace = self.trace
        owner: dict[int, tuple[str, int]] = {}
        for request_id, table in trace.tables[step].items():
            for index, block in enumerate(table):
                owner[block] = (request_id, index)
        rows = -(-trace.num_blocks // COLUMNS)
        z = [[None] * COLUMNS for _ in range(rows)]
        text = [[""] * COLUMNS for _ in range(rows)]
        hover = [[""] * COLUMNS for _ in range(rows)]
        for block in range(trace.num_blocks):
            r, c = divmod(block, COLUMNS)
            if block in owner:
                request_id, index = owner[block]
                z[r][c], text[r][c] = int(request_id.lstrip("r")), request_id
                hover[r][c] = f"block {block}: {request_id}, entry {index} of its block table"
            else:
                hover[r][c] = f"block {block}: free"
        return z, text, hover

    def draw(self) -> None:
        if self.trace is None:
            return
        step = min(self.step.value, len(self.trace.tables) - 1)
        z, text, hover = self.grid(step)
        row = self.trace.timeline.iloc[step]
        with self.figure.batch_update():
            set_trace(self.figure, POOL, z=z, text=text, customdata=hover)
            self.figure.layout.title.text = (
                f"Block pool at step {step}: {row['held_blocks']} of {self.trace.num_blocks} blocks of "
                f"{self.trace.block_size} tokens held; {row['running']} running, {row['waiting']} waiting, "
                f"{row['finished']} finished")

    def tables_caption(self) -> str:
        return (f"Block tables at step {self.step.value} (logical block i of a request lives in physical block "
                "table[i])")

    def table_frame(self) -> pd.DataFrame:
        """One row per running request at the current step: its tokens and its block table."""
        step = min(self.step.value, len(self.trace.tables) - 1) if self.trace else 0
        tables = self.trace.tables[step] if self.trace else {}
        rows = [{"request": rid, "tokens": self.trace.tokens[step][rid], "block table": " ".join(map(str, table))}
                for rid, table in tables.items()]
        return pd.DataFrame(rows, columns=["request", "tokens", "block table"]).set_index("request")
