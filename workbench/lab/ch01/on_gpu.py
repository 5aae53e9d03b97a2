"""Chapter 1 on a GPU: one Llama-3-8B layer's prefill time by part, to 32K tokens, on an H200.

Attention's arithmetic grows with N² and the projections' and MLP's with N, so at some length attention must
take most of a layer's time; the question is where, on real hardware. The GPU file times one layer of the 8B
shape in bf16 (random weights) from 512 to 32,768 tokens with the same `time_layer_parts` the chapter runs on
the learner's device.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.lab.kit.figures import style
from workbench.lab.kit.gpu_beside import GpuBeside
from workbench.lab.kit.gpu_results import GpuResult
from workbench.roofline.layer_cost import PARTS, loglog_slope


def _builder(cpu):
    def build(result: GpuResult) -> tuple[go.Figure, list[str]]:
        frame = pd.DataFrame(result.measurement["layer_parts"]).set_index("tokens")
        fig = go.Figure()
        for part in PARTS:
            fig.add_trace(go.Scatter(x=frame.index, y=1e3 * frame[f"{part} s"], mode="lines+markers", name=part))
        fig.update_xaxes(type="log", title_text="prompt tokens (N)")
        fig.update_yaxes(type="log", title_text="ms per layer")
        style(fig, "One layer's prefill time by part on a GPU", f"{result.label}, one Llama-3-8B layer")
        upper = frame[frame.index >= frame.index[len(frame) // 2]]
        slope = {p: loglog_slope(upper.index, upper[f"{p} s"]) for p in PARTS}
        longest = int(frame.index[-1])
        share = float(frame["attention share"].iloc[-1])
        sentences = [
            f"On the {result.device} attention takes **{share:.0%}** of the layer's time at {longest:,} tokens "
            f"({frame['attention share'].iloc[0]:.0%} at {int(frame.index[0]):,}); over the longer half of the "
            f"lengths its time grows as N^{slope['attention']:.1f}, the MLP's as N^{slope['MLP']:.1f}.",
            ("So attention has overtaken the linear parts within this range." if share > 0.5 else
             f"So within {longest:,} tokens attention has not yet overtaken the linear parts on this GPU"
             + (f", though its share rises with every doubling from {int(frame.index[-3]):,} tokens on."
                if frame["attention share"].iloc[-3:].is_monotonic_increasing else "."))]
        if cpu is not None:
            sentences.append(f"On this device, with {cpu.spec.name}, attention's share at {cpu.longest:,} tokens "
                             f"is {cpu.attention_share:.0%}.")
        return fig, sentences
    return build


def on_gpu(cpu=None) -> GpuBeside:
    """The stored GPU layer timing; ``cpu``: the chapter's `LayerTiming` on this device."""
    return GpuBeside.build("ch01", _builder(cpu))
