"""Chapter 6's memory-limited panel: ``MemoryLimitedLab`` runs the fp32 cache and one quantized format on the
same KV bytes with more requests than the fp32 cache holds (`workbench.lab.ch06.capacity_run`), and draws what
each format's batch and throughput came to, with the caps it ran under."""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
from plotly.subplots import make_subplots

from workbench.lab.ch06.capacity_run import MemoryLimitedRun, memory_limited_run
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel

BATCH, SPEED = "peak decode batch", "output tokens/s"


class MemoryLimitedLab(LabPanel):
    """The fp32 cache against a quantized one on the same KV bytes: does the larger batch pay for the
    dequantization? (``MemoryLimitedRun``; about 15 s on a quiet 2-core CPU.)"""

    def __init__(self, model, tokenizer, *, kv_format: str = "int8", requests: int = 24):
        self.model, self.tokenizer, self.requests = model, tokenizer, requests
        self.kv_format = widgets.Dropdown(options=["int8", "fp8_e4m3", "int4"], value=kv_format,
                                          description="against")
        fig = make_subplots(rows=1, cols=2, subplot_titles=(BATCH, SPEED))
        fig.add_bar(name=BATCH, row=1, col=1)
        fig.add_bar(name=SPEED, row=1, col=2)
        fig.update_yaxes(title_text="sequences", row=1, col=1)
        fig.update_yaxes(title_text="tokens/s", row=1, col=2)
        self.figure = style(fig, "The same KV memory, two cache formats", measured_on(model), height=360)
        super().__init__([self.kv_format], [fig])

    def measure(self) -> MemoryLimitedRun:
        return memory_limited_run(self.model, self.tokenizer, ("auto", self.kv_format.value),
                                  requests=self.requests, progress=self.progress)

    def draw(self) -> None:
        run: MemoryLimitedRun = self.result
        names = ["fp32 (auto)" if f == "auto" else f for f in run.frame["kv_format"]]
        with self.figure.batch_update():
            set_trace(self.figure, BATCH, x=names, y=list(run.frame["peak_batch"]))
            set_trace(self.figure, SPEED, x=names, y=list(run.frame["output_tok_s"]))
            self.figure.layout.title.text = (f"The same {run.budget_bytes / 2**20:.1f} MiB of KV, {run.requests} "
                                             "requests at once: batch and throughput by cache format")
        small, base = run.row(self.kv_format.value), run.row("auto")
        self.status.value = (
            f"On {run.budget_bytes / 2**20:.1f} MiB of KV the fp32 cache ran at most <b>{int(base['peak_batch'])}</b> "
            f"sequences and {self.kv_format.value} <b>{int(small['peak_batch'])}</b>; throughput "
            f"<b>{base['output_tok_s']:.1f}</b> vs <b>{small['output_tok_s']:.1f}</b> tokens/s "
            f"({small['output_tok_s'] / base['output_tok_s']:.2f}×). What bounded each batch: {run.sentence()}.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [("Per cache format, on the same KV bytes", self.result.frame.round(2))]


__all__ = ["MemoryLimitedLab"]
