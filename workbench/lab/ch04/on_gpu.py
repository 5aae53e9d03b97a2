"""Chapter 4 on a GPU: the same engine steps under an H200's roofline, beside the learner's device.

The roofline's lesson is where the ridge sits: a step whose arithmetic intensity (FLOP per byte moved) is below
the ridge is bound by memory, above it by arithmetic. On a laptop CPU the ridge is a few FLOP per byte, so a
modest decode batch or a short prompt crosses it; on a datacenter GPU it is a couple of hundred, and decode at
any batch that fits stays on the memory side. The GPU steps come from `benchmarks/gpu_chapters.py` (Llama-3-8B
shape, bf16, random weights); the learner's come from the chapter's own roofline panel when passed in.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.lab.kit.figures import style
from workbench.lab.kit.gpu_beside import GpuBeside
from workbench.lab.kit.gpu_results import GpuResult


def first_compute_bound(points: pd.DataFrame, kind: str) -> int | None:
    """The smallest prompt length (prefill) or batch (decode) whose step is bound by arithmetic, if any."""
    rows = points[(points["kind"] == kind) & (points["bound"] == "compute")]
    key = "context" if kind == "prefill" else "batch"
    return int(rows[key].min()) if not rows.empty else None


def _add_device(fig: go.Figure, col: int, points: pd.DataFrame, flops: float, bandwidth: float, name: str) -> None:
    x = np.logspace(-1, 4, 60)
    fig.add_trace(go.Scatter(x=x, y=np.minimum(x * bandwidth, flops) / 1e12, mode="lines", name=f"roof: {name}",
                             line={"color": "#888", "dash": "dash"}), row=1, col=col)
    for kind, color in (("prefill", "#1f77b4"), ("decode", "#d62728")):
        rows = points[points["kind"] == kind]
        key, word = ("context", "prompt") if kind == "prefill" else ("batch", "batch")
        labels = [f"{kind} {word} {int(value)}" for value in rows[key]]
        achieved = rows["intensity"] * rows["bytes_per_s"] if "bytes_per_s" in rows else rows["flops_per_s"]
        fig.add_trace(go.Scatter(x=rows["intensity"], y=achieved / 1e12, mode="markers", text=labels,
                                 name=f"{kind} steps: {name}", marker={"color": color, "size": 9}),
                      row=1, col=col)


def _builder(cpu):
    def build(result: GpuResult) -> tuple[go.Figure, list[str]]:
        m = result.measurement
        gpu = pd.DataFrame(m["steps"])
        if "bytes_per_s" not in gpu:  # files that stored intensity and the share of the roof only
            roof = np.minimum(gpu["intensity"] * m["peak_bytes_per_s"], m["peak_flops_per_s"])
            gpu["flops_per_s"] = gpu["share_of_roof"] * roof
        cols = 2 if cpu is not None else 1
        fig = make_subplots(rows=1, cols=cols, subplot_titles=(
            [f"this device ({cpu.machine}, {cpu.dtype})", result.device] if cpu is not None else [result.device]))
        if cpu is not None:
            _add_device(fig, 1, cpu.points, cpu.peaks.flops_per_s, cpu.peaks.bytes_per_s, "this device")
        _add_device(fig, cols, gpu, m["peak_flops_per_s"], m["peak_bytes_per_s"], result.device)
        fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte)")
        fig.update_yaxes(type="log", title_text="TFLOP/s achieved")
        style(fig, "Prefill and decode steps under each device's roofline",
              f"GPU: {result.label}, Llama-3-8B shape", height=460)
        ridge = m["ridge_flop_per_byte"]
        decode = gpu[gpu["kind"] == "decode"]
        widest = decode.loc[decode["batch"].idxmax()]
        prefill_cross = first_compute_bound(gpu, "prefill")
        sentences = [
            f"On the {result.device} the ridge is **{ridge:,.0f} FLOP per byte** "
            f"({m['peak_flops_per_s'] / 1e12:,.0f} TFLOP/s over {m['peak_bytes_per_s'] / 1e9:,.0f} GB/s).",
            f"Every decode step measured there is bound by memory, up to batch {int(widest['batch'])} "
            f"(intensity {widest['intensity']:.0f}, {widest['share_of_roof']:.0%} of the bandwidth roof);",
            (f"a prefill is bound by arithmetic from {prefill_cross:,} tokens on." if prefill_cross
             else "no prefill measured there reaches the ridge.")]
        if cpu is not None:
            cpu_ridge = cpu.peaks.ridge
            cpu_decode = first_compute_bound(cpu.points, "decode")
            ratio = ridge / cpu_ridge
            sentences.append(
                f"On this device the ridge is {cpu_ridge:.1f} FLOP per byte, "
                + (f"{ratio:.{0 if ratio >= 10 else 1}f}x lower: " if ratio >= 1 else f"{1 / ratio:.1f}x higher: ")
                + (f"decode is bound by arithmetic from batch {cpu_decode} on, which no GPU decode batch here reaches."
                   if cpu_decode else "its decode steps are memory-bound too, but much closer to the ridge.")
                + " The model and dtype differ (SmolLM2 in float32 here), but intensity is a ratio, and the "
                  "lesson is the ridge's position: what is compute-bound on a CPU is memory-bound on a GPU.")
        return fig, sentences
    return build


def on_gpu(cpu=None) -> GpuBeside:
    """The stored GPU roofline; ``cpu``: the chapter's `RooflineSteps` from this device, drawn beside it."""
    return GpuBeside.build("ch04", _builder(cpu))
