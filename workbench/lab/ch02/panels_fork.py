"""Chapter 2's copy-on-write panel: the block tables of a request's ``n`` samples at one engine step, and the
blocks they hold with and without sharing over the run (the run is `workbench.lab.ch02.fork`)."""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.lab.ch02.fork import COPIED, PRIVATE, SHARED, ForkTrace, parallel_sampling_trace
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel

STATE_COLORS = [[0, "#9ecae1"], [0.33, "#9ecae1"], [0.34, "#fd8d3c"], [0.66, "#fd8d3c"], [0.67, "#d62728"],
                [1, "#d62728"]]
GRID, HELD, UNSHARED = "block tables", "blocks held (shared prompt)", "without sharing (a copy of the prompt each)"


class ParallelSamplingLab(LabPanel):
    """The samples' block tables at one engine step, and blocks held with and without sharing over the run."""

    def __init__(self, model, tokenizer, *, n: int = 3, prompt_tokens: int = 40, max_tokens: int = 6):
        self.model, self.tokenizer = model, tokenizer
        self.prompt_tokens, self.max_tokens = prompt_tokens, max_tokens
        self.n = widgets.IntSlider(value=n, min=2, max=6, description="samples n")
        self.step = widgets.IntSlider(value=1, min=0, max=max_tokens - 2, description="after step")
        grid = go.Figure(go.Heatmap(name=GRID, colorscale=STATE_COLORS, zmin=0, zmax=2, showscale=False, xgap=3,
                                    ygap=3, texttemplate="%{text}", textfont={"size": 14},
                                    hovertemplate="%{customdata}<extra></extra>"))
        grid.update_xaxes(title_text="logical block (table entry)", dtick=1)
        grid.update_yaxes(autorange="reversed", dtick=1)
        style(grid, "Block tables", measured_on(model) + " — cell = physical block id; blue private, orange shared "
              "(reference count > 1), red copied on write at this step", height=300)
        held = go.Figure()
        held.add_scatter(name=HELD, mode="lines+markers", line={"color": "#1f77b4"})
        held.add_scatter(name=UNSHARED, mode="lines+markers", line={"color": "#7f7f7f", "dash": "dash"})
        held.update_xaxes(title_text="engine step", dtick=1)
        held.update_yaxes(title_text="KV blocks", rangemode="tozero")
        style(held, "Blocks held by the request's samples", measured_on(model), height=340)
        self.grid, self.held = grid, held
        super().__init__([self.n], [grid, held], redraw_only=[self.step])

    def measure(self) -> ForkTrace:
        trace = parallel_sampling_trace(self.model, self.tokenizer, prompt_tokens=self.prompt_tokens,
                                        n=self.n.value, max_tokens=self.max_tokens)
        self._holding = True  # a shorter run clamps the step slider: that must not redraw a half-updated panel
        try:
            self.step.max = len(trace.steps) - 1
        finally:
            self._holding = False
        self.progress.finish(f"{len(trace.steps)} engine steps")
        return trace

    @property
    def shown_step(self) -> int:
        return min(self.step.value, len(self.result.steps) - 1)

    def cells(self, step: int) -> tuple[list[list[int]], list[list[str]], list[list[str]]]:
        """State, label and hover text of every (sample, table entry) at ``step``."""
        snap = self.result.steps[step]
        width = max(len(t) for t in snap.tables)
        z, text, hover = [], [], []
        for sample, table in enumerate(snap.tables):
            z.append([COPIED if i in snap.copied[sample] else SHARED if snap.refs[b] > 1 else PRIVATE
                      for i, b in enumerate(table)] + [None] * (width - len(table)))
            text.append([str(b) for b in table] + [""] * (width - len(table)))
            hover.append([f"sample {sample}, entry {i}: block {b}, reference count {snap.refs[b]}"
                          for i, b in enumerate(table)] + [""] * (width - len(table)))
        return z, text, hover

    def draw(self) -> None:
        trace, step = self.result, self.shown_step
        z, text, hover = self.cells(step)
        snap = trace.steps[step]
        with self.grid.batch_update():
            set_trace(self.grid, GRID, z=z, text=text, customdata=hover, y=[f"sample {i}" for i in range(trace.n)])
            self.grid.layout.title.text = (f"Block tables of n = {trace.n} samples after engine step {step} "
                                           f"(prompt {trace.prompt_tokens} tokens, blocks of {trace.block_size})")
        held, unshared = trace.held_blocks(), trace.unshared_blocks()
        steps = list(range(len(trace.steps)))
        with self.held.batch_update():
            set_trace(self.held, HELD, x=steps, y=held)
            set_trace(self.held, UNSHARED, x=steps, y=unshared)
        shared = sum(1 for count in snap.refs.values() if count > 1)
        self.status.value = (
            f"After step {step}: {shared} block(s) shared by the samples, {sum(map(len, snap.copied))} copied on "
            f"write at this step. Over the run the engine made <b>{trace.copies()}</b> copy-on-write copies; at the "
            f"end the samples hold <b>{held[-1]}</b> blocks where separate copies of the prompt would need "
            f"<b>{unshared[-1]}</b>.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        snap = self.result.steps[self.shown_step]
        rows = [{"sample": i, "tokens cached": snap.tokens[i], "block table": " ".join(map(str, table)),
                 "reference counts": " ".join(str(snap.refs[b]) for b in table)}
                for i, table in enumerate(snap.tables)]
        return [(f"Block tables after step {self.step.value}", pd.DataFrame(rows).set_index("sample"))]
