"""Chapter 6's panels on activations and on the cached sweep: ``ActivationLab`` (one layer's real inputs through
int8 weights four ways) and ``FormatSweepLab`` (every weight × KV configuration from the benchmark's cached sweep,
labelled with the command and the date that measured it)."""

from __future__ import annotations

from pathlib import Path

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.lab.ch06.activations import PROJECTIONS
from workbench.lab.ch06.runs import ActivationRounding, FormatSweep, activation_rounding, format_sweep, heldout_slice
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.quality.format_sweep import SWEEP_PATH

ERROR = "relative output error"
SWEEP_METRICS = {"kl_mean": "mean KL vs fp32/fp32 (nats, log)", "top1_agreement": "top-1 agreement with fp32/fp32",
                 "perplexity": "perplexity on held-out text", "recall@2048": "recall at 2,048 tokens"}


class ActivationLab(LabPanel):
    """One layer's real inputs through int8 weights four ways (`ActivationRounding`)."""

    def __init__(self, model, tokenizer, *, layer: int = 15, projection: str = "down_proj", tokens: int = 256):
        self.model, self.tokenizer, self.tokens = model, tokenizer, tokens
        self.layer = widgets.IntSlider(value=layer, min=0, max=model.spec.num_layers - 1, description="layer")
        self.projection = widgets.Dropdown(options=list(PROJECTIONS), value=projection, description="input of")
        fig = go.Figure()
        fig.add_bar(name=ERROR)
        fig.update_yaxes(title_text="‖y − y_float‖ / ‖y_float‖ (log)", type="log")
        self.figure = style(fig, "Rounding activations as well as weights", measured_on(model))
        super().__init__([self.layer, self.projection], [fig])

    def measure(self) -> ActivationRounding:
        ids = heldout_slice(self.tokenizer, self.tokens)
        return activation_rounding(self.model, ids, self.layer.value, self.projection.value)

    def draw(self) -> None:
        r = self.result
        with self.figure.batch_update():
            set_trace(self.figure, ERROR, x=list(r.errors.index), y=list(r.errors.relative_error))
        s = r.spread
        self.status.value = (f"Layer {r.layer} {r.projection}: int8 weights alone err by {r.weights_only:.2%}; "
                             f"adding 7-bit per-tensor activations {r.per_tensor:.2%} "
                             f"({r.per_tensor / r.weights_only:.1f}×). The largest token's max |x| is "
                             f"{s['token_max_over_median']:.0f}× the median token's (the first token's: "
                             f"{s['first_token_over_median']:.2g}×), the largest input channel "
                             f"{s['channel_max_over_median']:.0f}× the median; the weight's rows only "
                             f"{s['weight_row_max_over_median']:.1f}×.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [("Relative error of the layer's output against the float layer", self.result.errors)]


class FormatSweepLab(LabPanel):
    """The cached sweep of every weight x KV configuration (`benchmarks/bench_weight_quant.py`, `FormatSweep`):
    quality against the memory one 2,048-token sequence needs (weights + its KV), the metric picked by a control."""

    def __init__(self, *, metric: str = "kl_mean", context: int = 2048, path: Path = SWEEP_PATH):
        self.context, self.path = context, path
        self.metric = widgets.Dropdown(options=[(v, k) for k, v in SWEEP_METRICS.items()], value=metric,
                                       description="quality")
        fig = go.Figure()
        fig.update_xaxes(title_text=f"MiB for weights + the KV of one {context:,}-token sequence")
        self.figure = fig
        super().__init__([], [fig], redraw_only=[self.metric])

    def measure(self) -> FormatSweep:
        return format_sweep(self.path, self.context)

    @property
    def meta(self) -> dict:
        return self.result.meta

    @property
    def frame(self) -> pd.DataFrame:
        return self.result.frame

    def draw(self) -> None:
        metric, sweep = self.metric.value, self.result
        s, meta = sweep.frame, sweep.meta
        style(self.figure, "Every weight × KV configuration (cached sweep)",
              f"CACHED: measured by `{meta['command']}` on {meta['date']} · {meta['machine']} · "
              "SmolLM2-135M-Instruct (dequantized Q4_1)", height=480)
        with self.figure.batch_update():
            self.figure.data = []
            for weights, group in s.groupby("weight_label", sort=False):
                self.figure.add_scatter(x=group.memory_mib, y=group[metric], mode="markers+text", name=weights,
                                        text=group.kv_format, textposition="top center", marker={"size": 12})
            self.figure.update_yaxes(title_text=SWEEP_METRICS[metric],
                                     type="log" if metric == "kl_mean" else "linear")
        best = s[s.kv_format != "auto"].sort_values("memory_mib").iloc[0]
        cost = sweep.kv_speed_cost("fp8_e4m3")
        slower = cost["throughput_ratio"] < 1
        why = (": on this CPU the cache is dequantized to fp32 on every decode step, so the saving is capacity and "
               "the speed cost is the conversion" if slower else "")
        self.status.value = (
            f"Cached sweep ({meta['date']}, {len(s)} configurations): the smallest, <b>{best.config}</b>, needs "
            f"{best.memory_mib:,.0f} MiB for one {self.context:,}-token sequence against {s.memory_mib.max():,.0f} "
            f"MiB for fp32/fp32, at {SWEEP_METRICS[metric].split(' (')[0]} {best[metric]:.4g}. An fp8 cache "
            f"(fp32 weights) fits {cost['sequences']} sequences in 1 GiB against {cost['sequences_fp32_kv']}, "
            f"{'but' if slower else 'and'} runs the sweep's throughput workload at {cost['throughput']:.1f} "
            f"tokens/s against {cost['throughput_fp32_kv']:.1f} ({cost['throughput_ratio']:.2f}×){why}.")

    def layered_table(self) -> pd.DataFrame:
        return self.result.layered_table()

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [("The layered table, measured (cached sweep; blocks and sequences at 1 GiB of KV, 2,048 tokens each)",
                 self.layered_table())]
