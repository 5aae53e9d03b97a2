"""Chapter 1's panels for the two claims the book only states: ``ContextTTFTLab`` (time to first token against
prompt length on the loaded model, with the decode step beside it and the prefill's FLOP count scaled onto the
same axes) and ``AttentionMemoryLab`` (one layer's activation peak with materialised N x N scores against the
engine's fused attention, with the score matrix's size and the layer's KV bytes as theory lines).

The measurements are in `workbench.lab.ch01.runs` and `workbench.lab.ch01.memory`; this module builds controls
and figures.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.config import ModelSpec
from workbench.lab.ch01.memory import AttentionMemory, attention_memory
from workbench.lab.ch01.runs import ContextTTFT, context_ttft
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import MiB, device_label, measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.models.llama import LlamaModel
from workbench.roofline.layer_cost import layer_flops

TTFT_LENGTHS = (64, 128, 256, 512, 1024, 2048)
MEMORY_LENGTHS = (256, 512, 1024, 2048, 4096)
TTFT, DECODE, FLOPS = ("time to first token (measured)", "the decode step after it (measured)",
                       "prefill FLOPs, scaled to the longest prompt")
MEMORY_TRACES = {"materialized_bytes": "materialised scores: layer peak (measured)",
                 "fused_bytes": "fused attention: layer peak (measured)",
                 "score_matrix_bytes": "score matrix, heads × N² (theory)",
                 "layer_kv_bytes": "the layer's K and V for N tokens (theory)"}


def prefill_flops(spec: ModelSpec, n: int) -> float:
    """FLOPs of a whole prefill of ``n`` tokens: every layer (with the config's own attention) plus the LM head
    for the one position that needs logits."""
    per_layer = sum(layer_flops(spec, n, spec.sliding_window).values())
    return spec.num_layers * per_layer + 2.0 * spec.hidden_size * spec.vocab_size


class ContextTTFTLab(LabPanel):
    """TTFT and the next decode step against prompt length, and the prefill's FLOPs scaled to the measurement
    (`ContextTTFT`, whose ``baseline()`` is the chapter's prefill and decode cost)."""

    def __init__(self, model: LlamaModel, tokenizer, *, longest: int = 1024, repeats: int = 2):
        self.model, self.tokenizer, self.repeats = model, tokenizer, repeats
        options = [(f"{n:,} tokens" + (" (about 2x the time of 1,024)" if n == 2048 else ""), n)
                   for n in TTFT_LENGTHS[2:]]
        self.longest = widgets.Dropdown(options=options, value=longest, description="longest prompt",
                                        style={"description_width": "initial"}, layout={"width": "360px"})
        fig = go.Figure()
        fig.add_scatter(name=TTFT, mode="lines+markers", line={"color": "#d62728"})
        fig.add_scatter(name=DECODE, mode="lines+markers", line={"color": "#1f77b4"})
        fig.add_scatter(name=FLOPS, mode="lines", line={"color": "gray", "dash": "dot"})
        fig.update_xaxes(title_text="prompt tokens")
        fig.update_yaxes(title_text="ms", rangemode="tozero")
        style(fig, "Time to first token is the prefill: it grows with the prompt, a decode step does not",
              measured_on(model))
        self.figure = fig
        super().__init__([self.longest], [fig])

    @property
    def lengths(self) -> list[int]:
        return [n for n in TTFT_LENGTHS if n <= self.longest.value]

    def measure(self) -> ContextTTFT:
        sweep = context_ttft(self.model, self.tokenizer, self.lengths, repeats=self.repeats, progress=self.progress)
        self.progress.finish(f"timed {len(sweep.frame)} prompt lengths on {device_label(self.model.device)}")
        return sweep

    def draw(self) -> None:
        sweep: ContextTTFT = self.result
        frame, n = sweep.frame, list(sweep.frame.index)
        flops = [prefill_flops(self.model.spec, x) for x in n]
        scale = sweep.ttft_long_ms / flops[-1]
        with self.figure.batch_update():
            set_trace(self.figure, TTFT, x=n, y=frame["ttft_ms"])
            set_trace(self.figure, DECODE, x=n, y=frame["decode_step_ms"])
            set_trace(self.figure, FLOPS, x=n, y=[f * scale for f in flops])
        self.status.value = (
            f"TTFT grows from <b>{sweep.ttft_short_ms:,.0f} ms</b> at {sweep.shortest:,} prompt tokens to "
            f"<b>{sweep.ttft_long_ms:,.0f} ms</b> at {sweep.longest:,} (log-log slope {sweep.slope:.2f} over the "
            f"longer half; {sweep.prefill_ms_per_token:.2f} ms per prompt token); the decode step after it stays "
            f"near <b>{sweep.decode_ms:,.0f} ms</b>, so the first token of the longest prompt costs as much as "
            f"{sweep.steps_per_ttft:,.0f} decode steps. Attention is {sweep.attention_flop_share():.0%} of that "
            "prefill's FLOPs.")


class AttentionMemoryLab(LabPanel):
    """One layer's activation peak with materialised scores vs the fused kernel, against N (log-log)
    (`AttentionMemory`)."""

    def __init__(self, model: LlamaModel, *, longest: int = 4096):
        self.model = model
        self.longest = widgets.Dropdown(options=[(f"{n:,} tokens", n) for n in MEMORY_LENGTHS[2:]], value=longest,
                                        description="longest N", style={"description_width": "initial"})
        fig = go.Figure()
        styles = {"materialized_bytes": ("#d62728", None, "lines+markers"),
                  "fused_bytes": ("#2ca02c", None, "lines+markers"),
                  "score_matrix_bytes": ("#d62728", "dot", "lines"), "layer_kv_bytes": ("#9467bd", "dash", "lines")}
        for column, name in MEMORY_TRACES.items():
            color, dash, mode = styles[column]
            fig.add_scatter(name=name, mode=mode, line={"color": color, "dash": dash})
        fig.update_xaxes(type="log", title_text="prompt tokens N")
        fig.update_yaxes(type="log", title_text="MiB")
        counted = "CUDA allocator" if model.device.type == "cuda" else "tensor bytes counted by the workbench"
        style(fig, "Memory of one layer's prefill: materialised N×N scores vs a fused kernel",
              f"layer 0, {counted}; {measured_on(model)}", height=460)
        self.figure = fig
        super().__init__([self.longest], [fig])

    @property
    def lengths(self) -> list[int]:
        return [n for n in MEMORY_LENGTHS if n <= self.longest.value]

    def measure(self) -> AttentionMemory:
        memory = attention_memory(self.model, self.lengths, progress=self.progress)
        self.progress.finish(f"measured {len(memory.frame)} lengths")
        return memory

    def draw(self) -> None:
        memory: AttentionMemory = self.result
        frame, n = memory.frame, list(memory.frame.index)
        with self.figure.batch_update():
            for column, name in MEMORY_TRACES.items():
                set_trace(self.figure, name, x=n, y=frame[column] / MiB)
            self.figure.update_xaxes(tickvals=n, ticktext=[f"{x:,}" for x in n])
        self.status.value = (
            f"At N = {memory.tokens:,} one layer's prefill peaks at <b>{memory.materialized_bytes / MiB:,.0f} MiB"
            f"</b> with materialised scores and <b>{memory.fused_bytes / MiB:,.0f} MiB</b> with the fused kernel "
            f"({memory.ratio:.1f}x). The score matrix alone is {frame['score_matrix_bytes'].iloc[-1] / MiB:,.0f} "
            f"MiB, {memory.scores_over_kv:.0f}x the layer's keys and values for those tokens. Log-log slopes over "
            f"the longer half: materialised {memory.slope('materialized_bytes'):.2f}, fused "
            f"{memory.slope('fused_bytes'):.2f}.")
