"""Chapter 6's panels on the KV cache and the weights: ``KVFormatLab`` (each KV format's bytes, the sequences a
budget holds, quality against the fp32 cache) and ``WeightFormatLab`` (batch-1 decode speed and quality of a
weight format beside fp32). The activation panel and the cached sweep are in `panels_sweep`.

Each control re-runs a measurement (`workbench.lab.ch06.runs`) on the model the notebook loaded and redraws
figures that say what they were measured on. The live panels keep to a slice of the held-out text so the notebook
fits its time budget.
"""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
import torch

from workbench.lab.ch06.runs import (
    WEIGHT_NAMES,
    KVFormats,
    WeightFormats,
    heldout_slice,
    kv_formats,
    llama_cpp_decode,
    weight_format_row,
)
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import MiB, measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.quality.format_sweep import BLOCK_SIZE
from workbench.quality.teacher_forcing import logits_through_cache
from workbench_kernels.kv_quant import KV_FORMATS

KV_NAMES = {"auto": "fp32 (no quantization)", "fp8_e4m3": "fp8 e4m3", "int8": "int8 + scale per token/head",
            "int4": "int4 + scales per 32 values"}
SELECTED, OTHER = "#d62728", "#9ecae1"
VALUES, SCALES, SEQUENCES, KL = ("K and V values", "scales stored beside them", "sequences at the budget",
                                 "KL(fp32 cache || this format)")
DECODE, FORMATS, PEER = "batch-1 decode", "formats", "llama.cpp (same GGUF)"


class KVFormatLab(LabPanel):
    """Every KV format's bytes per token (scales counted), blocks and sequences at a budget, and quality against the
    fp32 cache on a slice of the held-out text (`KVFormats`); the format control picks the one the status line
    reads, the budget only re-divides memory."""

    def __init__(self, model, tokenizer, *, kv_format: str = "int8", heldout_tokens: int = 512,
                 budget_gib: float = 1.0, context: int = 2048):
        self.model, self.tokenizer, self.context = model, tokenizer, context
        self.kv_format = widgets.Dropdown(options=[(KV_NAMES[f], f) for f in KV_FORMATS], value=kv_format,
                                          description="KV format")
        self.tokens = widgets.Dropdown(options=[256, 512, 1024], value=heldout_tokens, description="held-out tokens")
        self.budget = widgets.FloatLogSlider(value=budget_gib, base=2, min=-2, max=4, step=1,
                                             description="budget (GiB)")
        bytes_fig, capacity_fig, quality_fig = go.Figure(), go.Figure(), go.Figure()
        bytes_fig.add_bar(name=VALUES)
        bytes_fig.add_bar(name=SCALES, marker_color="#ff7f0e")
        bytes_fig.update_layout(barmode="stack")
        bytes_fig.update_yaxes(title_text="bytes per token (all layers, K and V)")
        capacity_fig.add_bar(name=SEQUENCES)
        capacity_fig.update_yaxes(title_text=f"sequences of {context:,} tokens")
        quality_fig.add_scatter(mode="markers+text", textposition="top center", marker={"size": 14}, name=KL)
        quality_fig.update_xaxes(title_text="bytes per token")
        quality_fig.update_yaxes(title_text="mean KL per position (nats, log)", type="log")
        subtitle = measured_on(model)
        self.figures_ = (style(bytes_fig, "KV cache bytes per token", subtitle),
                         style(capacity_fig, "Sequences that fit in the KV budget", subtitle),
                         style(quality_fig, "Quality against memory (teacher-forced held-out text)", subtitle))
        super().__init__([self.tokens], list(self.figures_), redraw_only=[self.kv_format, self.budget])

    def measure(self) -> KVFormats:
        result = kv_formats(self.model, self.tokenizer, self.tokens.value, progress=self.progress)
        self.progress.finish(f"{len(KV_FORMATS)} formats on {result.tokens} held-out tokens")
        return result

    def table(self) -> pd.DataFrame:
        """The measured frame plus blocks and sequences at the current budget."""
        return self.result.table(self.budget.value, self.context)

    def draw(self) -> None:
        t, chosen = self.table(), self.kv_format.value
        names = [KV_NAMES[f] for f in t.index]
        colors = [SELECTED if f == chosen else OTHER for f in t.index]
        bytes_fig, capacity_fig, quality_fig = self.figures_
        with bytes_fig.batch_update():
            set_trace(bytes_fig, VALUES, x=names, y=list(t.data_bytes), marker_color=colors)
            set_trace(bytes_fig, SCALES, x=names, y=list(t.scale_bytes))
        with capacity_fig.batch_update():
            set_trace(capacity_fig, SEQUENCES, x=names, y=list(t.sequences_at_budget), marker_color=colors,
                      text=[f"{b:,} blocks" for b in t.blocks_at_budget])
            capacity_fig.update_layout(title_text=f"Sequences that fit in {self.budget.value:g} GiB of KV cache")
        q = t[t.index != "auto"]
        with quality_fig.batch_update():
            set_trace(quality_fig, KL, x=list(q.bytes_per_token), y=list(q.kl_mean),
                      text=[f"{f}: top-1 {a:.3f}" for f, a in zip(q.index, q.top1_agreement, strict=True)],
                      marker_color=[SELECTED if f == chosen else "#1f77b4" for f in q.index])
        row = t.loc[chosen]
        scales = f", {int(row.scale_bytes):,} of them scales" if row.scale_bytes else ""
        quality = ("the reference itself" if chosen == "auto" else
                   f"mean KL {row.kl_mean:.2e} nats, top-1 agreement {row.top1_agreement:.3f}, perplexity "
                   f"{row.perplexity:.2f} (fp32 cache {row.perplexity_reference:.2f})")
        self.status.value = (f"<b>{KV_NAMES[chosen]}</b>: {int(row.bytes_per_token):,} bytes per token{scales} "
                             f"({row.vs_fp32:.3f}× fp32, saves {self.result.saving_vs_16bit(chosen):.0%} against a "
                             f"16-bit cache); {int(row.blocks_at_budget):,} blocks of {BLOCK_SIZE} in "
                             f"{self.budget.value:g} GiB = {int(row.sequences_at_budget):,} sequences of "
                             f"{self.context:,} tokens; quality on {self.result.tokens} held-out tokens: {quality}.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        cols = ["bytes_per_token", "data_bytes", "scale_bytes", "vs_fp32", "blocks_at_budget", "sequences_at_budget",
                "kl_mean", "kl_p95", "top1_agreement", "perplexity"]
        return [(f"KV formats at {self.budget.value:g} GiB, quality on {self.result.tokens} held-out tokens",
                 self.table()[cols])]


class WeightFormatLab(LabPanel):
    """Batch-1 decode speed and quality (against the fp32 model, fp32 cache) of the chosen weight format, beside
    the fp32 model's (`WeightFormats`); each format is measured the first time it is chosen. llama.cpp's decode on
    the same GGUF file is drawn as a line, measured now where ``llama-bench`` is built on this machine, else from
    the stored side-by-side run with the machine it ran on (``peer=False`` leaves it out)."""

    def __init__(self, model, tokenizer, *, weights: str = "int8", heldout_tokens: int = 512,
                 decode_tokens: int = 32, repeats: int = 2, peer: bool = True):
        self.model, self.tokenizer, self.with_peer = model, tokenizer, peer
        self.peer = None
        self.decode_tokens, self.repeats, self.heldout_tokens = decode_tokens, repeats, heldout_tokens
        self.weights = widgets.Dropdown(options=[(v, k) for k, v in WEIGHT_NAMES.items()], value=weights,
                                        description="weights")
        self.ids: list[int] = []
        self.reference = None  # the fp32 model's logits on ids, computed on the first measurement
        self.rows: dict[str, dict] = {}
        speed, quality = go.Figure(), go.Figure()
        speed.add_bar(name=DECODE)
        speed.add_scatter(name=PEER, mode="lines", line={"dash": "dash", "color": "#333333"})
        speed.update_yaxes(title_text="decode tokens/s (batch 1, best of runs)")
        quality.add_scatter(mode="markers+text", textposition="top center", marker={"size": 14}, name=FORMATS)
        quality.update_xaxes(title_text="weight MiB (allocated)")
        quality.update_yaxes(title_text="top-1 agreement with fp32")
        subtitle = measured_on(model)
        self.speed_fig = style(speed, "Decode speed by weight format", subtitle)
        self.quality_fig = style(quality, "Quality against weight memory", subtitle)
        super().__init__([self.weights], [self.speed_fig, self.quality_fig])

    def measure(self) -> WeightFormats:
        if self.reference is None:
            self.ids = heldout_slice(self.tokenizer, self.heldout_tokens)
            self.reference = logits_through_cache(self.model, self.ids, "auto")
        for name in ("fp32", self.weights.value):
            if name not in self.rows:
                self.rows[name] = weight_format_row(self.model, self.tokenizer, name, self.ids, self.reference,
                                                    decode_tokens=self.decode_tokens, repeats=self.repeats,
                                                    progress=self.progress)
        if self.with_peer and self.peer is None:
            self.progress(1, 2, "llama.cpp on the same GGUF file")
            self.peer = llama_cpp_decode(self.decode_tokens, torch.get_num_threads())
        self.progress.finish(f"measured: {', '.join(self.rows)}")
        return WeightFormats(tuple(self.rows.values()), len(self.ids), self.peer)

    @property
    def frame(self) -> pd.DataFrame:
        return self.result.frame

    def draw(self) -> None:
        f, chosen = self.frame, self.weights.value
        colors = [SELECTED if n == chosen else OTHER for n in f.index]
        with self.speed_fig.batch_update():
            set_trace(self.speed_fig, DECODE, x=[WEIGHT_NAMES[n] for n in f.index], y=list(f.decode_tokens_per_s),
                      marker_color=colors, text=[f"{s:.2f}×" for s in f.speedup_vs_fp32])
        with self.quality_fig.batch_update():
            set_trace(self.quality_fig, FORMATS, x=list(f.weight_bytes_allocated / MiB), y=list(f.top1_agreement),
                      text=[WEIGHT_NAMES[n] for n in f.index], marker_color=colors)
        peer, names = self.result.peer, [WEIGHT_NAMES[n] for n in f.index]
        with self.speed_fig.batch_update():
            set_trace(self.speed_fig, PEER, x=names if peer else [], y=[peer.tokens_per_s] * len(names) if peer else [],
                      hovertext=peer.label if peer else None)
        row = f.loc[chosen]
        peer_text = "" if peer is None else (
            f" llama.cpp on the same GGUF file: {peer.tokens_per_s:.1f} tokens/s ({peer.label}); this format "
            f"{row.decode_tokens_per_s / peer.tokens_per_s:.2f}× of it"
            + ("." if peer.live else " (not measured on this machine: compare with care)."))
        self.status.value = (f"<b>{WEIGHT_NAMES[chosen]}</b>: {row.weight_bytes_allocated / MiB:,.0f} MiB of weights "
                             f"({row.bytes_vs_fp32:.2f}× fp32), batch-1 decode {row.decode_tokens_per_s:.1f} tokens/s "
                             f"({row.speedup_vs_fp32:.2f}× fp32); against fp32 on {self.result.tokens} held-out "
                             f"tokens: top-1 agreement {row.top1_agreement:.3f}, mean KL {row.kl_mean:.2e} "
                             f"nats.{peer_text}")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        cols = ["weight_bytes_formula", "weight_bytes_allocated", "bytes_vs_fp32", "decode_tokens_per_s",
                "speedup_vs_fp32", "kl_mean", "top1_agreement", "perplexity"]
        return [("Weight formats measured so far (batch 1, fp32 KV cache)", self.frame[cols])]
