"""Chapter 7 on a GPU: what verifying K drafts costs the target model on an H200.

Speculative decoding pays when a forward over K + 1 positions costs little more than over one (r close to 1).
On the learner's CPU that is true at batch 1 and stops being true quickly as the batch grows; on a GPU the
forward stays bound by reading the weights for far longer. The GPU numbers are the device's own: each forward is
a captured CUDA graph replayed back to back, so host overheads are excluded (the engine does not yet graph
verification steps, so end to end it would pay more). SmolLM2-135M and Llama-3-8B shapes, bf16.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.lab.kit.figures import style
from workbench.lab.kit.gpu_beside import GpuBeside
from workbench.lab.kit.gpu_results import GpuResult


def _builder(cpu_curve, k: int):
    def build(result: GpuResult) -> tuple[go.Figure, list[str]]:
        rows = pd.DataFrame(result.measurement["forward_cost"])
        models = list(dict.fromkeys(rows["model"]))
        fig = make_subplots(rows=1, cols=len(models), subplot_titles=models, shared_yaxes=True)
        colors = dict(zip(sorted(set(rows["batch"])), ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"),
                          strict=False))
        for col, model in enumerate(models, start=1):
            for batch, group in rows[rows["model"] == model].groupby("batch"):
                fig.add_trace(go.Scatter(x=group["k"], y=group["r"], mode="lines+markers", name=f"batch {batch}",
                                         legendgroup=str(batch), showlegend=col == 1,
                                         line={"color": colors.get(batch)}), row=1, col=col)
        fig.update_xaxes(type="log", title_text="drafts verified per sequence (K)", tickvals=sorted(set(rows["k"])))
        fig.update_yaxes(title_text="r = verify forward ÷ plain forward", row=1, col=1)
        style(fig, "What verification costs the target model on a GPU", result.label, height=440)

        def r(model: str, batch: int) -> float | None:
            hit = rows[(rows["model"] == model) & (rows["batch"] == batch) & (rows["k"] == k)]
            return float(hit["r"].iloc[0]) if not hit.empty else None

        big = models[-1]
        batches = sorted(set(rows["batch"]))
        sentences = [
            f"On the {result.device}, verifying K = {k} drafts at batch 1 costs r = "
            + " and ".join(f"{r(m, 1):.2f} ({m})" for m in models if r(m, 1) is not None) + ": almost free.",
            f"At batch {batches[-1]} the {big} shape pays r = {r(big, batches[-1]):.2f}: the batch already uses "
            "the weights it reads, so the extra positions cost real arithmetic."]
        if cpu_curve is not None:
            sentences.append(
                f"On this device the same forward cost curve gives r = {cpu_curve.ratio(k + 1):.2f} at batch 1 and "
                f"{cpu_curve.verify_cost(16)(k):.2f} at batch 16 (GPU, {big}: "
                f"{r(big, 16) if r(big, 16) is not None else float('nan'):.2f}): the batch at which speculation stops "
                "paying is much larger on the GPU.")
        return fig, sentences
    return build


def on_gpu(cpu_curve=None, k: int = 4) -> GpuBeside:
    """The stored GPU verification costs; ``cpu_curve``: the chapter's `ForwardCurve` on this device."""
    return GpuBeside.build("ch07", _builder(cpu_curve, k))
