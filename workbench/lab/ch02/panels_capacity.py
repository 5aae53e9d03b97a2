"""Chapter 2's memory-planning panels, computed from real configs (no weights are built):

* ``KVShareLab`` tests the book's "KV cache is 10-30% of GPU memory": the share a serving engine gives the
  cache on each of several deployments, with the book's band drawn across the bars;
* ``KVCapacityLab`` plots the KV bytes of a batch against batch size for several context lengths, for one
  model, under the KV budget a chosen GPU (or several, tensor-parallel) leaves it.

The arithmetic lives in `workbench.lab.ch02.budget`; this module only builds widgets and figures.
"""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.lab.ch02.budget import (
    GPU_MEMORY,
    SEED_RANGE,
    STEP_TOKENS,
    UTILIZATION,
    KVCapacity,
    KVShare,
    kv_capacity,
    kv_share,
)
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import GiB, fmt_bytes
from workbench.lab.kit.panel import LabPanel
from workbench.models import config_names
from workbench_kernels.kv_quant import KV_FORMATS

KV_COLOR = "#9467bd"
CONTEXTS = [1024, 4096, 8192, 32768, 131072]
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
COMPUTED_FROM = "computed from datasets/configs (bf16 weights, no weights built)"
SHARE_BAR, BUDGET_LINE = "KV cache", "KV budget of the deployment"


def context_trace(context: int) -> str:
    return f"context {context:,}"


class KVShareLab(LabPanel):
    """The KV cache's share of GPU memory on several deployments, next to the book's 10-30%."""

    def __init__(self, *, utilization: float = UTILIZATION, step_tokens: int = STEP_TOKENS):
        self.utilization = widgets.Dropdown(options=[0.8, 0.9, 0.95], value=utilization,
                                            description="memory utilization", style={"description_width": "initial"})
        self.step_tokens = widgets.Dropdown(options=[2048, 8192, 16384], value=step_tokens,
                                            description="tokens per step", style={"description_width": "initial"})
        fig = go.Figure()
        fig.add_bar(name=SHARE_BAR, orientation="h", marker_color=KV_COLOR, textposition="outside")
        fig.add_vrect(x0=100 * SEED_RANGE[0], x1=100 * SEED_RANGE[1], fillcolor="#ffbb78", opacity=0.35,
                      line_width=0, annotation_text="the book's 10–30%", annotation_position="top left")
        fig.update_xaxes(title_text="KV cache share of the GPUs' memory (%)", range=[0, 105])
        fig.update_yaxes(autorange="reversed")
        style(fig, "What a serving engine leaves the KV cache", COMPUTED_FROM, height=520)
        self.figure = fig
        super().__init__([self.utilization, self.step_tokens], [fig])

    def measure(self) -> KVShare:
        return kv_share(self.utilization.value, self.step_tokens.value)

    def draw(self) -> None:
        result = self.result
        table = result.table
        labels = [f"{s:.0f}%" if s == s else "weights do not fit" for s in 100 * table["kv_cache"]]
        with self.figure.batch_update():
            set_trace(self.figure, SHARE_BAR, y=list(table.index), x=100 * table["kv_cache"].fillna(0), text=labels,
                      customdata=[f"weights {w:.0%}, activations {a:.0%}, held back {h:.0%}"
                                  for w, a, h in zip(table["weights"], table["activations"].fillna(0),
                                                     table["held_back"], strict=True)],
                      hovertemplate="%{y}: KV %{x:.0f}%<br>%{customdata}<extra></extra>")
            self.figure.layout.title.text = (
                f"What a serving engine leaves the KV cache: {result.utilization:.0%} of memory usable, "
                f"activations of {result.step_tokens:,}-token steps")
        v = result.verdict
        self.status.value = (
            f"Across {v['fitting']} deployments that fit, the KV cache gets from <b>{v['lowest']:.0%}</b> to "
            f"<b>{v['highest']:.0%}</b> of GPU memory; <b>{v['inside']}</b> fall inside the book's 10–30%, and "
            f"{v['not_fitting']} cannot hold the weights at all. The share is whatever weights and activations "
            "leave, not a fraction anyone chooses.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        shown = self.result.table.copy()
        for column in ("weights", "activations", "kv_cache", "held_back"):
            shown[column] = (100 * shown[column]).round(1)
        cannot = shown["kv_cache"].isna()
        for column in ("activations", "kv_cache", "kv_GiB"):
            shown[column] = shown[column].astype(object).where(~cannot, "does not fit")
        shown = shown.rename(columns={"weights": "weights %", "activations": "activations %",
                                      "kv_cache": "KV cache %", "held_back": "held back %",
                                      "sequences": "sequences of that context"})
        return [("How each deployment's memory divides (bf16 weights and KV)", shown)]


class KVCapacityLab(LabPanel):
    """KV bytes against batch size for several contexts, under one deployment's KV budget."""

    def __init__(self, *, model: str = "llama-3-8b", gpu: str = "80 GiB GPU", gpus: int = 1,
                 kv_cache_dtype: str = "bfloat16"):
        self.model = widgets.Dropdown(options=config_names(), value=model, description="model")
        self.gpu = widgets.Dropdown(options=list(GPU_MEMORY), value=gpu, description="GPU")
        self.gpus = widgets.Dropdown(options=[1, 2, 4, 8], value=gpus, description="GPUs (TP)",
                                     style={"description_width": "initial"})
        self.kv_cache_dtype = widgets.Dropdown(options=["bfloat16", *KV_FORMATS[1:]], value=kv_cache_dtype,
                                         description="kv_cache_dtype")
        fig = go.Figure()
        for context in CONTEXTS:
            fig.add_scatter(name=context_trace(context), mode="lines+markers")
        fig.add_scatter(name=BUDGET_LINE, mode="lines", line={"color": "black", "dash": "dash"})
        fig.update_xaxes(type="log", title_text="sequences in the batch", dtick="D1")
        fig.update_yaxes(type="log", title_text="KV cache (GiB)")
        style(fig, "KV cache of a batch", COMPUTED_FROM, height=460)
        self.figure = fig
        super().__init__([self.model, self.gpu, self.gpus, self.kv_cache_dtype], [fig])

    def measure(self) -> KVCapacity:
        return kv_capacity(self.model.value, self.gpu.value, self.gpus.value, CONTEXTS, BATCHES,
                           kv_format=self.kv_cache_dtype.value)

    def draw(self) -> None:
        result = self.result
        frame, budget = result.frame, result.budget
        budget_gib = budget.kv_budget_bytes / GiB if budget else None
        with self.figure.batch_update():
            for context in CONTEXTS:
                rows = frame[frame["context"] == context]
                set_trace(self.figure, context_trace(context), x=rows["batch"], y=rows["kv_bytes"] / GiB,
                          visible=bool(len(rows)))
            x, y = ([BATCHES[0], BATCHES[-1]], [budget_gib] * 2) if budget_gib else ([], [])
            set_trace(self.figure, BUDGET_LINE, x=x, y=y)
            self.figure.layout.title.text = f"KV cache of a batch: {result.deployment}, KV in {result.kv_format}"
        if budget is None:
            self.status.value = (f"{result.deployment}: the bf16 weights and activations leave <b>no room</b> for a "
                                 "KV cache; add GPUs (tensor parallelism) or pick a larger GPU.")
            return
        fits = ", ".join(f"<b>{n:,}</b> at {c:,}" for c, n in result.max_sequences().items())
        total = self.gpus.value * GPU_MEMORY[self.gpu.value]
        self.status.value = (f"{result.deployment}: KV budget <b>{fmt_bytes(budget.kv_budget_bytes)}</b> "
                             f"({budget.kv_budget_bytes / total:.0%} of memory). "
                             f"Sequences that fit at once, by context: {fits} tokens.")
