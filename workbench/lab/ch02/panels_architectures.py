"""Chapter 2's figures of the 2025-26 architectures' KV caches (`workbench.lab.ch02.architectures`):

* ``ArchitectureLab``: per architecture, the bytes one sequence holds at a chosen context, stacked by layer group
  (full, sliding, MLA, linear-attention state), and how many sequences' KV fits an 80 GB GPU; controls for the
  context, the tensor-parallel degree (watch MLA stay put) and the KV dtype. Computed, so it runs in milliseconds;
* ``sliding_figure``: the engine's KV-group allocator live, each group's blocks against the tokens computed;
* ``whatif_figure``: the what-if's quality cost beside the memory it saves;
* ``WindowWhatIfLab``: that figure from the stored run of ``benchmarks/bench_window_whatif.py`` at once, and a
  button that re-runs a smaller version live (about a minute on a quiet 2-core CPU): a button, so that running
  the chapter top to bottom stays within its budget.
"""

from __future__ import annotations

from pathlib import Path

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.lab.ch02.architectures import (
    WHATIF_PATH,
    ArchitectureSizes,
    SlidingRun,
    WhatIf,
    architecture_sizes,
    cached_whatif,
    live_whatif,
    whatif_reading,
)
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.panel import LabPanel

KIND_COLORS = {"full": "#1f77b4", "sliding": "#2ca02c", "mla": "#d62728", "linear": "#9467bd"}
COMPUTED = "computed from datasets/configs with vLLM's layouts (no weights built)"


def _kind(group: str) -> str:
    return group.split()[0]


def architecture_reading(sizes: ArchitectureSizes) -> str:
    """The Llama-3.1-70B against DeepSeek-V3 comparison in words, per GPU at the result's tensor-parallel degree."""
    context = int(sizes.frame["context"].iloc[0])
    llama, mla = sizes.per_token("llama-3.1-70b", context), sizes.per_token("deepseek-v3", context)
    where = "on one GPU (TP 1)" if sizes.tp == 1 else f"on each of {sizes.tp} GPUs (TP {sizes.tp})"
    split = (" (TP splits the Llama's 8 KV heads across ranks but copies MLA's single latent to every rank)"
             if sizes.tp > 1 else "")
    return (f"At {context:,} tokens, {where}: Llama-3.1-70B holds {llama / 1024:,.0f} KiB per token of context, "
            f"DeepSeek-V3's MLA {mla / 1024:,.0f} KiB, the Llama <b>{llama / mla:.1f}x</b> the MLA model's{split}; "
            f"90% of an 80 GB GPU, were it all KV (the weights are not counted), holds "
            f"{sizes.sequences('llama-3.1-70b', context):,} against {sizes.sequences('deepseek-v3', context):,} "
            "of their sequences.")


class ArchitectureLab(LabPanel):
    """Bytes per sequence by layer group, and sequences that fit, for every architecture at one context."""

    def __init__(self, *, context: int = 131072, tp: int = 1, kv_cache_dtype: str = "bfloat16"):
        style_ = {"description_width": "initial"}
        self.context = widgets.Dropdown(options=[8192, 32768, 131072], value=context, description="context",
                                        style=style_)
        self.tp = widgets.Dropdown(options=[1, 2, 4, 8], value=tp, description="tensor parallel", style=style_)
        self.kv_cache_dtype = widgets.Dropdown(options=["bfloat16", "fp8_e4m3"], value=kv_cache_dtype,
                                               description="kv_cache_dtype",
                                         style=style_)
        fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.22, column_widths=[0.6, 0.4],
                            subplot_titles=("KV of one sequence, by layer group (GiB)",
                                            "sequences whose KV fits 90% of 80 GB"))
        for kind, color in KIND_COLORS.items():
            fig.add_bar(name=kind, orientation="h", marker_color=color, row=1, col=1)
        fig.add_bar(name="sequences", orientation="h", marker_color="#7f7f7f", showlegend=False,
                    textposition="outside", row=1, col=2)
        fig.update_layout(barmode="stack")
        fig.update_yaxes(autorange="reversed")
        self.figure = style(fig, "The KV cache of 2025-26 architectures", COMPUTED, height=480)
        super().__init__([self.context, self.tp, self.kv_cache_dtype], [self.figure])

    def measure(self) -> ArchitectureSizes:
        return architecture_sizes(contexts=(self.context.value,), tp=self.tp.value,
                                  kv_cache_dtype=self.kv_cache_dtype.value)

    def draw(self) -> None:
        sizes: ArchitectureSizes = self.result
        frame = sizes.frame.assign(kind=sizes.frame["group"].map(_kind))
        models = list(dict.fromkeys(frame["model"]))
        context = int(frame["context"].iloc[0])
        with self.figure.batch_update():
            for kind in KIND_COLORS:
                per_model = frame[frame.kind == kind].groupby("model")["bytes_per_sequence"].sum()
                set_trace(self.figure, kind, y=models, x=[per_model.get(m, 0) / 2**30 for m in models])
            counts = [sizes.sequences(m, context) for m in models]
            set_trace(self.figure, "sequences", y=models, x=counts, text=[f"{c:,}" for c in counts])
            self.figure.layout.title.text = (f"The KV cache of 2025-26 architectures at {context:,} tokens "
                                             f"({sizes.kv_cache_dtype}, TP {sizes.tp})")
        self.status.value = architecture_reading(sizes)

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        sizes: ArchitectureSizes = self.result
        table = sizes.frame.pivot_table(index="model", columns="group", values="bytes_per_sequence", aggfunc="sum",
                                        fill_value=0)
        return [("bytes per sequence by layer group", table)]


def sliding_figure(run: SlidingRun) -> go.Figure:
    """Blocks each KV group holds while one sequence grows: the windowed groups flatten at the window, the full
    group climbs with the context; the dotted line counts the blocks the windows let go of."""
    fig = go.Figure()
    frame = run.frame
    for name in run.window_groups + run.full_groups:
        sliding = name in run.window_groups
        fig.add_scatter(x=frame["tokens"], y=frame[name], mode="lines", name=name,
                        line={"color": KIND_COLORS["sliding" if sliding else "full"], "width": 1 if sliding else 3})
    fig.add_scatter(x=frame["tokens"], y=frame["slid_blocks"], mode="lines", name="blocks let go of (all groups)",
                    line={"color": "#7f7f7f", "dash": "dot"})
    fig.update_xaxes(title_text="tokens computed")
    fig.update_yaxes(title_text="blocks held", rangemode="tozero")
    return style(fig, f"The KV-group allocator live: a {run.window}-token window on five layers of six",
                 f"SmolLM2-135M, blocks of {run.block_size} tokens, one sequence", height=440)


MEASURED_HERE = "SmolLM2-135M-Instruct, dequantized Q4_1 weights, fp32; measured here"


def whatif_figure(table: pd.DataFrame, subtitle: str = MEASURED_HERE) -> go.Figure:
    """Quality kept (recall, perplexity ratio) beside memory kept (KV per sequence and the engine's peak), each
    window against full attention."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("quality", "memory, × full attention"))
    recall_cols = [c for c in table.columns if c.startswith("recall@")]
    for label, row in table.iterrows():
        fig.add_bar(name=str(label), x=[c.removeprefix("recall@") + " tok recall" for c in recall_cols]
                    + ["perplexity ÷ full"], y=[row[c] for c in recall_cols] + [row["perplexity_vs_full"]],
                    row=1, col=1)
        fig.add_bar(name=str(label), x=["KV per sequence", "engine's peak KV"], showlegend=False,
                    y=[row["kv_vs_full"], row["peak_vs_full"]], row=1, col=2)
    fig.update_layout(barmode="group")
    return style(fig, "What the window costs and what it saves (a what-if: SmolLM2 was trained without windows)",
                 subtitle, height=440)


class WindowWhatIfLab(LabPanel):
    """The what-if's quality cost beside its memory saving: the stored run first (instant), and a button that
    re-runs a smaller version in this kernel. No control re-measures: only the button does."""

    def __init__(self, model, tokenizer, *, path: Path = WHATIF_PATH, live_sizes: dict | None = None):
        self.model, self.tokenizer, self.path = model, tokenizer, path
        self.live_sizes = live_sizes or {}  # live_whatif's windows, lengths, per_length (its defaults otherwise)
        self.live = False
        self.button = widgets.Button(description="re-run live, smaller (about 1 min)",
                                     layout={"width": "auto"}, tooltip="one window, 2 items per length")
        self.button.on_click(lambda _button: self.run_live())
        self.figure = go.Figure()
        super().__init__([], [self.figure], rows=[self.button])

    def run_live(self) -> WhatIf:
        """Measure the smaller version in this kernel and redraw (what the button does)."""
        self.live, self.button.disabled = True, True
        try:
            self.refresh()
        finally:
            self.button.disabled = False
        return self.result

    def measure(self) -> WhatIf:
        if self.live:
            return live_whatif(self.model, self.tokenizer, **self.live_sizes)
        return cached_whatif(self.path)

    def draw(self) -> None:
        whatif: WhatIf = self.result
        drawn = whatif_figure(whatif.table, whatif.source if whatif.cached else MEASURED_HERE)
        with self.figure.batch_update():
            self.figure.data = []
            self.figure.add_traces(drawn.data)
            self.figure.layout = drawn.layout
        self.status.value = f"{whatif.source}. {whatif_reading(whatif.table)}"

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        columns = [c for c in self.result.table.columns if c.startswith("recall")] + [
            "perplexity", "perplexity_past_window", "full_perplexity_same_positions", "kv_vs_full", "peak_vs_full"]
        return [("quality and memory, each attention", self.result.table[columns].round(3))]
