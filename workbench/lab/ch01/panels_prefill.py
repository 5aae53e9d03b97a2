"""Chapter 1's panels for the two claims the course only states: ``TTFTLab`` (time to first token against
prompt length on the loaded model, with the decode step beside it and the prefill's FLOP count scaled onto the
same axes) and ``AttentionMemoryLab`` (one layer's activation peak with materialised N x N scores against the
engine's fused attention, with the score matrix's size and the layer's KV bytes as theory lines).

Measurements come from `workbench.lab.ch01_measures`; this module only builds widgets and figures.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.config import ModelSpec
from workbench.lab.attention_cost import layer_flops, loglog_slope
from workbench.lab.ch01_measures import attention_memory, ttft_sweep
from workbench.lab.kit.figures import style
from workbench.lab.kit.notebook import MiB, device_label, measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.models.llama import LlamaModel

TTFT_LENGTHS = (64, 128, 256, 512, 1024, 2048)
MEMORY_LENGTHS = (256, 512, 1024, 2048, 4096)


def prefill_flops(spec: ModelSpec, n: int) -> float:
    """FLOPs of a whole prefill of ``n`` tokens: every layer (with the config's own attention) plus the LM head
    for the one position that needs logits."""
    per_layer = sum(layer_flops(spec, n, spec.sliding_window).values())
    return spec.num_layers * per_layer + 2.0 * spec.hidden_size * spec.vocab_size


def upper_half_slope(frame, column: str) -> float:
    """Log-log slope of ``column`` against the index over the longer half of the lengths (short ones are set
    by fixed overheads, not by the work)."""
    upper = frame.iloc[len(frame) // 2:]
    return loglog_slope(upper.index, upper[column])


class TTFTLab(LabPanel):
    """TTFT and the next decode step against prompt length, and the prefill's FLOPs scaled to the measurement."""

    def __init__(self, model: LlamaModel, tokenizer, *, longest: int = 1024, repeats: int = 2):
        self.model, self.tokenizer, self.repeats = model, tokenizer, repeats
        options = [(f"{n:,} tokens" + (" (about 2x the time of 1,024)" if n == 2048 else ""), n)
                   for n in TTFT_LENGTHS[3:]]
        self.longest = widgets.Dropdown(options=options, value=longest, description="longest prompt",
                                        style={"description_width": "initial"}, layout={"width": "360px"})
        fig = go.Figure()
        fig.add_scatter(name="time to first token (measured)", mode="lines+markers", line={"color": "#d62728"})
        fig.add_scatter(name="the decode step after it (measured)", mode="lines+markers", line={"color": "#1f77b4"})
        fig.add_scatter(name="prefill FLOPs, scaled to the longest prompt", mode="lines",
                        line={"color": "gray", "dash": "dot"})
        fig.update_xaxes(title_text="prompt tokens")
        fig.update_yaxes(title_text="ms", rangemode="tozero")
        style(fig, "Time to first token is the prefill: it grows with the prompt, a decode step does not",
              measured_on(model))
        self.figure, self.frame = fig, None
        super().__init__([self.longest], [fig])
        self.refresh()

    @property
    def lengths(self) -> list[int]:
        return [n for n in TTFT_LENGTHS if n <= self.longest.value]

    def measure(self) -> None:
        self.frame = ttft_sweep(self.model, self.tokenizer, self.lengths, repeats=self.repeats,
                                progress=self.progress)
        self.progress.finish(f"timed {len(self.frame)} prompt lengths on {device_label(self.model.device)}")

    def summary(self) -> dict[str, float]:
        """The numbers the status line reads: TTFT at the shortest and longest prompt, their slope, the decode
        step, how many decode steps the longest TTFT equals, and attention's share of its FLOPs."""
        frame, spec = self.frame, self.model.spec
        longest = int(frame.index[-1])
        flops = layer_flops(spec, longest, spec.sliding_window)
        return {"shortest": int(frame.index[0]), "longest": longest,
                "ttft_short_ms": float(frame["ttft_ms"].iloc[0]), "ttft_long_ms": float(frame["ttft_ms"].iloc[-1]),
                "slope": upper_half_slope(frame, "ttft_ms"), "decode_ms": float(frame["decode_step_ms"].median()),
                "steps_per_ttft": float(frame["ttft_ms"].iloc[-1] / frame["decode_step_ms"].median()),
                "attention_flop_share": flops["attention"] / sum(flops.values())}

    def draw(self) -> None:
        frame, n = self.frame, list(self.frame.index)
        flops = [prefill_flops(self.model.spec, x) for x in n]
        scale = frame["ttft_ms"].iloc[-1] / flops[-1]
        with self.figure.batch_update():
            self.figure.data[0].x, self.figure.data[0].y = n, frame["ttft_ms"]
            self.figure.data[1].x, self.figure.data[1].y = n, frame["decode_step_ms"]
            self.figure.data[2].x, self.figure.data[2].y = n, [f * scale for f in flops]
        s = self.summary()
        self.status.value = (
            f"TTFT grows from <b>{s['ttft_short_ms']:,.0f} ms</b> at {s['shortest']:,} prompt tokens to "
            f"<b>{s['ttft_long_ms']:,.0f} ms</b> at {s['longest']:,} (log-log slope {s['slope']:.2f} over the longer "
            f"half); the decode step after it stays near <b>{s['decode_ms']:,.0f} ms</b>, so the first token of the "
            f"longest prompt costs as much as {s['steps_per_ttft']:,.0f} decode steps. Attention is "
            f"{s['attention_flop_share']:.0%} of that prefill's FLOPs.")


class AttentionMemoryLab(LabPanel):
    """One layer's activation peak with materialised scores vs the fused kernel, against N (log-log)."""

    def __init__(self, model: LlamaModel, *, longest: int = 4096):
        self.model = model
        self.longest = widgets.Dropdown(options=[(f"{n:,} tokens", n) for n in MEMORY_LENGTHS[2:]], value=longest,
                                        description="longest N", style={"description_width": "initial"})
        fig = go.Figure()
        for name, color, dash, mode in (
                ("materialised scores: layer peak (measured)", "#d62728", None, "lines+markers"),
                ("fused attention: layer peak (measured)", "#2ca02c", None, "lines+markers"),
                ("score matrix, heads × N² (theory)", "#d62728", "dot", "lines"),
                ("the layer's K and V for N tokens (theory)", "#9467bd", "dash", "lines")):
            fig.add_scatter(name=name, mode=mode, line={"color": color, "dash": dash})
        fig.update_xaxes(type="log", title_text="prompt tokens N")
        fig.update_yaxes(type="log", title_text="MiB")
        counted = "CUDA allocator" if model.device.type == "cuda" else "tensor bytes counted by the workbench"
        style(fig, "Memory of one layer's prefill: materialised N×N scores vs a fused kernel",
              f"layer 0, {counted}; {measured_on(model)}", height=460)
        self.figure, self.frame = fig, None
        super().__init__([self.longest], [fig])
        self.refresh()

    @property
    def lengths(self) -> list[int]:
        return [n for n in MEMORY_LENGTHS if n <= self.longest.value]

    def measure(self) -> None:
        self.frame = attention_memory(self.model, self.lengths, progress=self.progress)
        self.progress.finish(f"measured {len(self.frame)} lengths")

    def summary(self) -> dict[str, float]:
        frame = self.frame
        last = frame.iloc[-1]
        return {"tokens": int(frame.index[-1]), "materialized_mib": last["materialized_bytes"] / MiB,
                "fused_mib": last["fused_bytes"] / MiB, "scores_mib": last["score_matrix_bytes"] / MiB,
                "kv_mib": last["layer_kv_bytes"] / MiB,
                "materialized_slope": upper_half_slope(frame, "materialized_bytes"),
                "fused_slope": upper_half_slope(frame, "fused_bytes")}

    def draw(self) -> None:
        frame, n = self.frame, list(self.frame.index)
        columns = ("materialized_bytes", "fused_bytes", "score_matrix_bytes", "layer_kv_bytes")
        with self.figure.batch_update():
            for trace, column in zip(self.figure.data, columns, strict=True):
                trace.x, trace.y = n, frame[column] / MiB
            self.figure.update_xaxes(tickvals=n, ticktext=[f"{x:,}" for x in n])
        s = self.summary()
        self.status.value = (
            f"At N = {s['tokens']:,} one layer's prefill peaks at <b>{s['materialized_mib']:,.0f} MiB</b> with "
            f"materialised scores and <b>{s['fused_mib']:,.0f} MiB</b> with the fused kernel "
            f"({s['materialized_mib'] / s['fused_mib']:.1f}x). The score matrix alone is {s['scores_mib']:,.0f} MiB, "
            f"{s['scores_mib'] / s['kv_mib']:.0f}x the layer's keys and values for those tokens. Log-log slopes "
            f"over the longer half: materialised {s['materialized_slope']:.2f}, fused {s['fused_slope']:.2f}.")
