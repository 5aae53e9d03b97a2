"""Chapter 10 on a GPU: does a greedy request's output depend on what else is in its batch, on an H200?

The same greedy request, alone and among up to 15 others joining at random steps, twelve times, in the default
mode and in the batch-invariant mode; and what the invariant mode costs in throughput (8 layers of the
Llama-3-8B shape, bf16, random weights: the tokens mean nothing, but whether the arithmetic changes does).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.lab.kit.figures import style
from workbench.lab.kit.gpu_beside import GpuBeside
from workbench.lab.kit.gpu_results import GpuResult


def _builder():
    def build(result: GpuResult) -> tuple[go.Figure, list[str]]:
        m = result.measurement
        modes = {"default": m["default"], "batch-invariant": m["invariant"]}
        cost = pd.DataFrame(m["mode_cost"])
        speed = cost.groupby("batch_invariant")["tokens_per_s"].median()
        fig = make_subplots(rows=1, cols=2, subplot_titles=["runs whose logits differed from the run alone",
                                                            "decode tokens/s (8 requests)"])
        fig.add_trace(go.Bar(x=list(modes), y=[v["runs_with_other_logits"] for v in modes.values()],
                             name="runs with other logits"), row=1, col=1)
        fig.add_trace(go.Bar(x=list(modes), y=[speed.get(False), speed.get(True)], name="tokens/s"), row=1, col=2)
        style(fig, "Batch invariance on a GPU", f"{result.label}, 8 layers of the Llama-3-8B shape", height=400)
        d, inv = m["default"], m["invariant"]
        sentences = [
            f"On the {result.device}, {d['runs_with_other_logits']} of {d['runs']} runs of the same greedy request "
            f"got different logits when other requests shared its batch (largest gap {d['max_logit_gap']:.3g}); "
            f"{d['runs_diverged']} changed a token within {m['max_tokens']} tokens (up to "
            f"{m['max_others']} others); with random weights only the logit gap means anything: whether a gap "
            "flips a token depends on a trained model's near-ties.",
            f"In the batch-invariant mode {inv['runs_with_other_logits']} of {inv['runs']} did, at "
            f"**{speed.get(False) / speed.get(True):.0f}x** lower throughput ({speed.get(True):,.0f} against "
            f"{speed.get(False):,.0f} tokens/s). That ratio mixes two things: the default replays CUDA graphs and "
            "its fused attention, the mode runs every step eagerly through its fixed-split PyTorch path; how much "
            "of it is the fixed splits alone was not measured (a default run without graphs would say)."]
        return fig, sentences
    return build


def on_gpu() -> GpuBeside:
    return GpuBeside.build("ch10", _builder())
