"""Chapter 1 lab: why attention costs what it costs.

The notebook imports this module as ``ch01``; it gathers the chapter's panels, exercises and closing table.
Two panels live here. ``LayerScalingLab`` times one real decoder layer's parts against sequence length on the device
(attention's N² against the projections' and MLP's N) and lets a sliding window bend the curve back to linear.
``KVMemoryLab`` sizes the KV cache of any config in ``datasets/configs`` under MHA, GQA, MQA and a sliding
window, per token and per sequence, and sets it next to the weights in a device's memory. Measurements come
from `workbench.lab.attention_cost` and `workbench.cache.sizing`; this module only builds widgets and figures.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from workbench.cache.sizing import attention_variants, kv_bytes_per_token, weight_bytes
from workbench.lab.attention_cost import PARTS, crossover_length, layer_flops, loglog_slope, time_layer_parts
from workbench.lab.ch01_panels import AttentionMemoryLab, TTFTLab
from workbench.lab.ch01_summary import EXERCISES, takeaways
from workbench.lab.kit.figures import style
from workbench.lab.kit.notebook import GiB, device_label, device_memory_bytes, fmt_bytes, measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.models import config_names, model_spec
from workbench.models.llama import LlamaModel

__all__ = ["EXERCISES", "AttentionMemoryLab", "KVMemoryLab", "LayerScalingLab", "TTFTLab", "takeaways"]

COLORS = {"attention": "#d62728", "qkv + output projections": "#1f77b4", "MLP": "#2ca02c"}
DEFAULT_LENGTHS = (128, 256, 512, 1024, 2048, 4096)
WINDOWS = (256, 1024)


class LayerScalingLab(LabPanel):
    """Time per layer part against N on a log-log plot, and attention's share of the layer."""

    def __init__(self, model: LlamaModel, *, lengths: tuple[int, ...] = DEFAULT_LENGTHS, layer: int = 0,
                 windows: tuple[int, ...] = WINDOWS):
        self.model, self.all_lengths, self.layer = model, lengths, layer
        # At least three lengths, so that a slope can be fitted over the longer half.
        self.max_tokens = widgets.Dropdown(options=sorted(lengths)[2:], value=max(lengths), description="longest N")
        self.window = widgets.Dropdown(options=[("full causal", 0)] + [(f"sliding window {w}", w) for w in windows],
                                       value=0, description="attention")
        fig = go.Figure(make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
            "time per layer part (log-log)", "attention's share of the layer")))
        for part in PARTS:
            fig.add_scatter(name=part, mode="lines+markers", line={"color": COLORS[part]}, row=1, col=1)
        for label, dash in (("∝ N² (reference)", "dot"), ("∝ N (reference)", "dash")):
            fig.add_scatter(name=label, mode="lines", line={"color": "gray", "dash": dash}, row=1, col=1)
        fig.add_scatter(name="measured share", mode="lines+markers", line={"color": COLORS["attention"]},
                        row=1, col=2)
        fig.add_scatter(name="FLOP share", mode="lines", line={"color": "black", "dash": "dot"}, row=1, col=2)
        fig.update_xaxes(type="log", title_text="sequence length N (tokens)")
        fig.update_yaxes(type="log", title_text="time (ms)", row=1, col=1)
        fig.update_yaxes(title_text="share of layer time (%)", range=[0, 100], row=1, col=2)
        style(fig, "One decoder layer's prefill: quadratic attention vs linear projections and MLP",
              f"layer {layer} of {model.spec.num_layers}, {measured_on(model)}", height=460)
        self.figure = fig
        self.frame = None
        super().__init__([self.max_tokens, self.window], [fig])
        self.refresh()

    @property
    def lengths(self) -> list[int]:
        return [n for n in self.all_lengths if n <= self.max_tokens.value]

    def measure(self) -> None:
        self.frame = time_layer_parts(self.model, self.lengths, window=self.window.value or None,
                                      layer=self.layer, progress=self.progress)
        self.progress.finish(f"timed {len(self.frame)} lengths on {device_label(self.model.device)}")

    def slopes(self) -> dict[str, float]:
        """Log-log slope of each part over the upper half of the lengths (small N is dominated by overheads)."""
        upper = self.frame.iloc[len(self.frame) // 2:]
        return {part: loglog_slope(upper.index, upper[f"{part} s"]) for part in PARTS}

    def draw(self) -> None:
        frame, n = self.frame, list(self.frame.index)
        window = self.window.value or None
        attention_ms = frame["attention s"].to_numpy() * 1e3
        last = attention_ms[-1]
        flops = [layer_flops(self.model.spec, x, window) for x in n]
        with self.figure.batch_update():
            for i, part in enumerate(PARTS):
                self.figure.data[i].x, self.figure.data[i].y = n, frame[f"{part} s"].to_numpy() * 1e3
            self.figure.data[3].x, self.figure.data[3].y = n, [last * (x / n[-1]) ** 2 for x in n]
            self.figure.data[4].x, self.figure.data[4].y = n, [last * (x / n[-1]) for x in n]
            self.figure.data[5].x, self.figure.data[5].y = n, frame["attention share"].to_numpy() * 100
            self.figure.data[6].x = n
            self.figure.data[6].y = [100 * f["attention"] / sum(f.values()) for f in flops]
        slopes = self.slopes()
        crossover = crossover_length(self.model.spec)
        where = f"N ≈ {crossover:,}" if crossover is not None else "no length (its sliding window keeps it linear)"
        self.status.value = (
            "log-log slopes over the longer half: " + ", ".join(f"{p} <b>{s:.2f}</b>" for p, s in slopes.items())
            + f". Attention takes <b>{frame['attention share'].iloc[-1]:.0%}</b> of the layer at N = {n[-1]:,}; "
            f"by FLOPs it would overtake the linear parts at {where}.")


def _device_memory_options(device: torch.device) -> list[tuple[str, int]]:
    here = device_memory_bytes(device)
    return [(f"this machine: {device_label(device)}, {fmt_bytes(here)}", here), ("24 GiB GPU", 24 * GiB),
            ("80 GiB GPU (A100 / H100)", 80 * GiB), ("141 GiB GPU (H200)", 141 * GiB)]


def own_variant(spec, table):
    """The row of an `attention_variants` table that is the config as published."""
    if spec.sliding_window is not None:
        return table.iloc[3]
    return table.loc[spec.attention_kind]


class KVMemoryLab(LabPanel):
    """KV bytes per sequence under MHA/GQA/MQA/SWA for a real config, and how a batch of them fills a device."""

    def __init__(self, device: torch.device | str = "cpu", *, model: str = "llama-3-8b", context: int = 8192,
                 kv_dtype: str = "bfloat16", batch: int = 8):
        self.model = widgets.Dropdown(options=config_names(), value=model, description="model")
        self.context = widgets.SelectionSlider(options=[1024, 4096, 8192, 32768, 131072], value=context,
                                               description="context")
        self.kv_dtype = widgets.Dropdown(options=["float32", "bfloat16", "float16", "fp8_e4m3", "int8", "int4"],
                                         value=kv_dtype, description="KV dtype")
        self.batch = widgets.IntSlider(value=batch, min=1, max=64, description="sequences")
        self.memory = widgets.Dropdown(options=_device_memory_options(torch.device(device)),
                                       description="device", layout={"width": "360px"})
        fig = go.Figure(make_subplots(rows=1, cols=2, horizontal_spacing=0.14, subplot_titles=(
            "KV cache of one sequence", "weights + KV of the batch, share of device memory")))
        fig.add_bar(name="KV per sequence", marker_color="#9467bd", textposition="outside", row=1, col=1)
        fig.add_bar(name="weights (bf16)", marker_color="#7f7f7f", row=1, col=2)
        fig.add_bar(name="KV of the batch", marker_color="#9467bd", row=1, col=2)
        fig.update_layout(barmode="stack")
        fig.update_yaxes(title_text="GiB", row=1, col=1)
        fig.update_yaxes(title_text="% of device memory", row=1, col=2)
        fig.add_hline(y=100, line_dash="dash", line_color="black", row=1, col=2)
        self.figure = fig
        self.table, self.spec = None, None
        super().__init__([self.model, self.context, self.kv_dtype, self.batch, self.memory], [fig])
        self.refresh()

    def measure(self) -> None:
        spec = model_spec(self.model.value)
        # SWA row: the model's own window if it has one, else 4096 (Mistral-7B's).
        self.table = attention_variants(spec, self.context.value, kv_format=self.kv_dtype.value,
                                        window=spec.sliding_window or 4096)
        self.spec = spec

    def draw(self) -> None:
        spec, table = self.spec, self.table
        weights = weight_bytes(spec, torch.bfloat16)
        device = self.memory.value
        names = list(table.index)
        per_seq = table["bytes_per_sequence"].to_numpy()
        batch = self.batch.value
        with self.figure.batch_update():
            self.figure.data[0].x, self.figure.data[0].y = names, per_seq / GiB
            self.figure.data[0].text = [fmt_bytes(b) for b in per_seq]
            self.figure.data[1].x, self.figure.data[1].y = names, [100 * weights / device] * len(names)
            self.figure.data[2].x, self.figure.data[2].y = names, 100 * batch * per_seq / device
            self.figure.layout.title.text = (f"{spec.name}: {spec.attention_kind} with {spec.num_kv_heads} KV heads "
                                             f"for {spec.num_heads} query heads, context {self.context.value:,}, "
                                             f"KV in {self.kv_dtype.value}")
            self.figure.layout.title.subtitle.text = ("computed from datasets/configs/"
                                                      f"{self.model.value}.json (no weights built)")
        per_token = kv_bytes_per_token(spec, self.kv_dtype.value)
        own = own_variant(spec, table)
        total = weights + batch * own["bytes_per_sequence"]
        self.status.value = (
            f"{spec.name} as configured ({own.name}): <b>{per_token:,} B per token</b>, "
            f"<b>{fmt_bytes(own['bytes_per_sequence'])}</b> per sequence of {self.context.value:,} tokens; "
            f"weights {fmt_bytes(weights)} (bf16). {batch} sequences + weights = {fmt_bytes(total)}, "
            f"<b>{total / device:.0%}</b> of {fmt_bytes(device)}.")
