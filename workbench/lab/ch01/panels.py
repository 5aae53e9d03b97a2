"""Chapter 1's panels on attention's shape: ``LayerScalingLab`` times one real decoder layer's parts against
sequence length (attention's N² against the projections' and MLP's N) and lets a sliding window bend the curve
back to linear; ``KVMemoryLab`` sizes the KV cache of any config in ``datasets/configs`` under MHA, GQA, MQA and
a sliding window, per sequence and next to the weights in a device's memory.

The measurements are in `workbench.lab.ch01.runs`; this module builds controls and figures.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from workbench.config import SIZED_KV_DTYPES
from workbench.lab.ch01.runs import KVMemory, LayerTiming, kv_memory, layer_timing
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import GiB, device_label, device_memory_bytes, fmt_bytes, measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.models import config_names
from workbench.models.llama import LlamaModel
from workbench.roofline.layer_cost import PARTS

COLORS = {"attention": "#d62728", "qkv + output projections": "#1f77b4", "MLP": "#2ca02c"}
DEFAULT_LENGTHS = (128, 256, 512, 1024, 2048, 4096)
WINDOWS = (256, 1024)
N2, N1 = "∝ N² (reference)", "∝ N (reference)"
MEASURED_SHARE, FLOP_SHARE = "measured share", "FLOP share"


class LayerScalingLab(LabPanel):
    """Time per layer part against N on a log-log plot, and attention's share of the layer (`LayerTiming`)."""

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
        for label, dash in ((N2, "dot"), (N1, "dash")):
            fig.add_scatter(name=label, mode="lines", line={"color": "gray", "dash": dash}, row=1, col=1)
        fig.add_scatter(name=MEASURED_SHARE, mode="lines+markers", line={"color": COLORS["attention"]}, row=1, col=2)
        fig.add_scatter(name=FLOP_SHARE, mode="lines", line={"color": "black", "dash": "dot"}, row=1, col=2)
        fig.update_xaxes(type="log", title_text="sequence length N (tokens)")
        fig.update_yaxes(type="log", title_text="time (ms)", row=1, col=1)
        fig.update_yaxes(title_text="share of layer time (%)", range=[0, 100], row=1, col=2)
        style(fig, "One decoder layer's prefill: quadratic attention vs linear projections and MLP",
              f"layer {layer} of {model.spec.num_layers}, {measured_on(model)}", height=460)
        self.figure = fig
        super().__init__([self.max_tokens, self.window], [fig])

    @property
    def lengths(self) -> list[int]:
        return [n for n in self.all_lengths if n <= self.max_tokens.value]

    def measure(self) -> LayerTiming:
        timing = layer_timing(self.model, self.lengths, window=self.window.value or None, layer=self.layer,
                              progress=self.progress)
        self.progress.finish(f"timed {len(timing.frame)} lengths on {device_label(self.model.device)}")
        return timing

    def draw(self) -> None:
        timing: LayerTiming = self.result
        frame, n, fig = timing.frame, list(timing.frame.index), self.figure
        last = float(frame["attention s"].iloc[-1]) * 1e3
        with fig.batch_update():
            for part in PARTS:
                set_trace(fig, part, x=n, y=frame[f"{part} s"].to_numpy() * 1e3)
            set_trace(fig, N2, x=n, y=[last * (x / n[-1]) ** 2 for x in n])
            set_trace(fig, N1, x=n, y=[last * (x / n[-1]) for x in n])
            set_trace(fig, MEASURED_SHARE, x=n, y=frame["attention share"].to_numpy() * 100)
            set_trace(fig, FLOP_SHARE, x=n, y=[100 * s for s in timing.flop_shares()])
        crossover = timing.crossover()
        flops = (f"by FLOPs it would overtake the linear parts at N ≈ {crossover:,}" if crossover is not None else
                 "by FLOPs it never overtakes them (past the window attention grows linearly, and more slowly)")
        self.status.value = (
            f"With {timing.variant}: log-log slopes over the longer half "
            + ", ".join(f"{p} <b>{s:.2f}</b>" for p, s in timing.slopes().items())
            + f". Attention takes <b>{timing.attention_share:.0%}</b> of the layer at N = {timing.longest:,}; "
            f"{flops}.")


def _device_memory_options(device: torch.device) -> list[tuple[str, int]]:
    here = device_memory_bytes(device)
    kind = "GPU" if torch.device(device).type == "cuda" else "RAM, not a GPU"
    return [("80 GiB GPU (A100 / H100)", 80 * GiB), ("24 GiB GPU", 24 * GiB), ("141 GiB GPU (H200)", 141 * GiB),
            (f"this machine's {kind}: {device_label(device)}, {fmt_bytes(here)}", here)]


KV_PER_SEQUENCE, WEIGHTS, KV_OF_BATCH = "KV per sequence", "weights (bf16)", "KV of the batch"


class KVMemoryLab(LabPanel):
    """KV bytes per sequence under MHA/GQA/MQA/SWA for a real config, and how a batch of them fills a device
    (`KVMemory`)."""

    def __init__(self, device: torch.device | str = "cpu", *, model: str = "llama-3-8b", context: int = 8192,
                 kv_cache_dtype: str = "bfloat16", batch: int = 8):
        self.model = widgets.Dropdown(options=config_names(), value=model, description="model")
        self.context = widgets.SelectionSlider(options=[1024, 4096, 8192, 32768, 131072], value=context,
                                               description="context")
        self.kv_cache_dtype = widgets.Dropdown(options=list(SIZED_KV_DTYPES), value=kv_cache_dtype,
                                                description="kv_cache_dtype")
        self.batch = widgets.IntSlider(value=batch, min=1, max=64, description="sequences")
        self.memory = widgets.Dropdown(options=_device_memory_options(torch.device(device)),
                                       description="device", layout={"width": "360px"})
        fig = go.Figure(make_subplots(rows=1, cols=2, horizontal_spacing=0.14, subplot_titles=(
            "KV cache of one sequence", "weights + KV of the batch, share of device memory")))
        fig.add_bar(name=KV_PER_SEQUENCE, marker_color="#9467bd", textposition="outside", row=1, col=1)
        fig.add_bar(name=WEIGHTS, marker_color="#7f7f7f", row=1, col=2)
        fig.add_bar(name=KV_OF_BATCH, marker_color="#9467bd", row=1, col=2)
        fig.update_layout(barmode="stack")
        fig.update_yaxes(title_text="GiB", row=1, col=1)
        fig.update_yaxes(title_text="% of device memory", row=1, col=2)
        fig.add_hline(y=100, line_dash="dash", line_color="black", row=1, col=2)
        self.figure = fig
        super().__init__([self.model, self.context, self.kv_cache_dtype, self.batch, self.memory], [fig])

    def measure(self) -> KVMemory:
        return kv_memory(self.model.value, self.context.value, self.kv_cache_dtype.value, self.batch.value,
                         self.memory.value)

    def draw(self) -> None:
        kv: KVMemory = self.result
        spec, names, fig = kv.spec, list(kv.table.index), self.figure
        per_seq = kv.table["bytes_per_sequence"].to_numpy()
        with fig.batch_update():
            set_trace(fig, KV_PER_SEQUENCE, x=names, y=per_seq / GiB, text=[fmt_bytes(b) for b in per_seq])
            set_trace(fig, WEIGHTS, x=names, y=[100 * kv.weights / kv.device_bytes] * len(names))
            set_trace(fig, KV_OF_BATCH, x=names, y=100 * kv.batch * per_seq / kv.device_bytes)
            fig.layout.title.text = (f"{spec.name}: {spec.attention_kind} with {spec.num_kv_heads} KV heads for "
                                     f"{spec.num_heads} query heads, context {kv.context:,}, KV in {kv.kv_cache_dtype}")
            fig.layout.title.subtitle.text = (f"computed from datasets/configs/{self.model.value}.json "
                                              f"(no weights built); device: {self.memory.label}")
        own = kv.own
        self.status.value = (
            f"{spec.name} as configured ({own.name}): <b>{kv.per_token:,} B per token</b>, "
            f"<b>{fmt_bytes(own['bytes_per_sequence'])}</b> per sequence of {kv.context:,} tokens; "
            f"weights {fmt_bytes(kv.weights)} (bf16). {kv.batch} sequences + weights = {fmt_bytes(kv.total)}, "
            f"<b>{kv.total / kv.device_bytes:.0%}</b> of the {self.memory.label}.")
