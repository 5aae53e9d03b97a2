"""Chapter 2's figure of the KV cache across GPUs (`workbench.lab.ch02.parallel`): computed, not measured, so it
has no controls; stored like a panel's figures (plotly JSON, HTML, PNG)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.lab.ch02.parallel import TPSweep
from workbench.lab.kit.figures import style
from workbench.models import model_spec

COLORS = {"llama-3-70b": "#d62728", "llama-3-8b": "#1f77b4", "smollm2-135m": "#2ca02c"}


def tp_figure(sweep: TPSweep) -> go.Figure:
    """Per-GPU KV bytes per token (left) and the fleet's total over the unsplit model's (right) against the TP
    degree: the per-GPU line flattens where the degree passes the KV head count, and the total rises there."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "KV bytes per token on one GPU (bf16)", "KV bytes per token on all GPUs ÷ unsplit"))
    for model, rows in sweep.frame.groupby("model", sort=False):
        kv = model_spec(model).num_kv_heads
        color = COLORS.get(model, "gray")
        fig.add_scatter(x=rows["tp"], y=rows["kv_bytes_per_token_per_gpu"], mode="lines+markers",
                        name=f"{model} ({kv} KV heads)", line={"color": color}, row=1, col=1)
        fig.add_scatter(x=rows["tp"], y=rows["kv_bytes_per_token_all_gpus"] / rows["kv_bytes_per_token_one_gpu"],
                        mode="lines+markers", name=f"{model}: total ÷ unsplit", line={"color": color, "dash": "dot"},
                        showlegend=False, row=1, col=2)
    fig.update_xaxes(type="log", dtick=0.30103, title_text="tensor-parallel degree")
    fig.update_yaxes(type="log", title_text="bytes per token", row=1, col=1)
    fig.update_yaxes(title_text="× the unsplit model's bytes", rangemode="tozero", row=1, col=2)
    return style(fig, "Splitting the cache across GPUs: each rank holds its KV heads, until none are left to split",
                 "computed from datasets/configs with vLLM's rules (no GPU needed)", height=440)
