"""Chapter 6's panels: the KV format, the weight format, activation rounding, and the cached layered sweep.

Why it exists: each of the chapter's controls re-runs a measurement on the model the notebook loaded and redraws
figures that say what they were measured on (`workbench.lab.common.LabPanel`). The live panels keep to a slice of
the held-out text so the notebook fits its time budget; the full-size numbers of every weight x KV configuration
come from the benchmark's cached sweep (`SweepLab`), labelled with the command and the date that measured them.
"""

from __future__ import annotations

import copy
from pathlib import Path

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
import torch

from workbench.cache.calibration import calibration_ids
from workbench.cache.sizing import kv_bytes_per_token, max_concurrency, weight_bytes
from workbench.lab.ch06.activations import PROJECTIONS, capture_inputs, rounding_errors, spread
from workbench.lab.kit.figures import style
from workbench.lab.kit.notebook import GiB, MiB, measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.models.int8_linear import model_weight_bytes, quantize_model_weights
from workbench.quality.format_sweep import (
    BLOCK_SIZE,
    KV_FORMATS,
    SWEEP_PATH,
    decode_tokens_per_s,
    heldout_ids,
    load_sweep,
)
from workbench.quality.teacher_forcing import compare_logits, logits_through_cache
from workbench_kernels.kv_quant import cache_shapes

KV_NAMES = {"auto": "fp32 (no quantization)", "fp8_e4m3": "fp8 e4m3", "int8": "int8 + scale per token/head",
            "int4": "int4 + scales per 32 values"}
WEIGHT_NAMES = {"fp32": "fp32", "int8": "int8 linears", "int8_all": "int8 linears + LM head", "bf16": "bfloat16"}
SELECTED, OTHER = "#d62728", "#9ecae1"


def kv_breakdown(spec, kv_format: str, model_dtype: torch.dtype = torch.float32) -> dict[str, int]:
    """Bytes per token across all layers, K and V: the values themselves and the per-slot scales beside them."""
    total = kv_bytes_per_token(spec, kv_format, model_dtype)
    shapes = cache_shapes(kv_format, 1, 1, spec.num_kv_heads, spec.head_dim, model_dtype)
    per_slot = torch.empty(shapes["data_shape"], dtype=shapes["data_dtype"]).nbytes
    data = 2 * spec.num_layers * per_slot
    return {"bytes_per_token": total, "data_bytes": data, "scale_bytes": total - data}


def heldout_slice(tokenizer, tokens: int) -> list[int]:
    return heldout_ids(tokenizer, tokens)


def quality_against(reference: torch.Tensor, logits: torch.Tensor, ids: list[int]) -> dict[str, float]:
    targets = torch.tensor(ids[1:], device=logits.device)
    return compare_logits(reference[:-1].to(logits.device).float(), logits[:-1].float(), targets)


class KVFormatLab(LabPanel):
    """Every KV format's bytes per token (scales counted), blocks and sequences at a budget, and quality against the
    fp32 cache on a slice of the held-out text; the format control picks the one the status line reads."""

    def __init__(self, model, tokenizer, *, kv_format: str = "int8", heldout_tokens: int = 512,
                 budget_gib: float = 1.0, context: int = 2048):
        self.model, self.tokenizer, self.context = model, tokenizer, context
        self.kv_format = widgets.Dropdown(options=[(KV_NAMES[f], f) for f in KV_FORMATS], value=kv_format,
                                          description="KV format")
        self.tokens = widgets.Dropdown(options=[256, 512, 1024], value=heldout_tokens, description="held-out tokens")
        self.budget = widgets.FloatLogSlider(value=budget_gib, base=2, min=-2, max=4, step=1,
                                             description="budget (GiB)")
        bytes_fig, capacity_fig, quality_fig = go.Figure(), go.Figure(), go.Figure()
        bytes_fig.add_bar(name="K and V values")
        bytes_fig.add_bar(name="scales stored beside them", marker_color="#ff7f0e")
        bytes_fig.update_layout(barmode="stack")
        bytes_fig.update_yaxes(title_text="bytes per token (all layers, K and V)")
        capacity_fig.add_bar(name="sequences at the budget")
        capacity_fig.update_yaxes(title_text=f"sequences of {context:,} tokens")
        quality_fig.add_scatter(mode="markers+text", textposition="top center", marker={"size": 14},
                                name="KL(fp32 cache || this format)")
        quality_fig.update_xaxes(title_text="bytes per token")
        quality_fig.update_yaxes(title_text="mean KL per position (nats, log)", type="log")
        subtitle = measured_on(model)
        self.figures_ = (style(bytes_fig, "KV cache bytes per token", subtitle),
                         style(capacity_fig, "Sequences that fit in the KV budget", subtitle),
                         style(quality_fig, "Quality against memory (teacher-forced held-out text)", subtitle))
        super().__init__([self.tokens], list(self.figures_), redraw_only=[self.kv_format, self.budget])
        self.refresh()

    def measure(self) -> None:
        ids = heldout_slice(self.tokenizer, self.tokens.value)
        reference = logits_through_cache(self.model, ids, "auto")
        rows = []
        for i, fmt in enumerate(KV_FORMATS):
            self.progress(i, len(KV_FORMATS), f"teacher-forcing {len(ids)} tokens through a {fmt} cache")
            calibration = calibration_ids(self.model, self.tokenizer) if fmt == "fp8_e4m3" else None
            logits = (reference if fmt == "auto" else
                      logits_through_cache(self.model, ids, fmt, calibration_ids=calibration))
            rows.append({"kv_format": fmt, **kv_breakdown(self.model.spec, fmt, self.model.dtype),
                         **quality_against(reference, logits, ids)})
        self.progress.finish(f"{len(KV_FORMATS)} formats on {len(ids)} held-out tokens")
        self.frame = pd.DataFrame(rows).set_index("kv_format")

    def table(self) -> pd.DataFrame:
        """The measured frame plus blocks and sequences at the current budget."""
        frame = self.frame.copy()
        budget = int(self.budget.value * GiB)
        frame["blocks_at_budget"] = budget // (frame["bytes_per_token"] * BLOCK_SIZE)
        frame["sequences_at_budget"] = [max_concurrency(int(b), BLOCK_SIZE, self.context)
                                        for b in frame["blocks_at_budget"]]
        frame["vs_fp32"] = frame["bytes_per_token"] / frame.loc["auto", "bytes_per_token"]
        return frame

    def draw(self) -> None:
        t, chosen = self.table(), self.kv_format.value
        names = [KV_NAMES[f] for f in t.index]
        colors = [SELECTED if f == chosen else OTHER for f in t.index]
        bytes_fig, capacity_fig, quality_fig = self.figures_
        with bytes_fig.batch_update():
            bytes_fig.data[0].x = bytes_fig.data[1].x = names
            bytes_fig.data[0].y, bytes_fig.data[1].y = list(t.data_bytes), list(t.scale_bytes)
            bytes_fig.data[0].marker.color = colors
        with capacity_fig.batch_update():
            capacity_fig.data[0].x, capacity_fig.data[0].y = names, list(t.sequences_at_budget)
            capacity_fig.data[0].marker.color = colors
            capacity_fig.data[0].text = [f"{b:,} blocks" for b in t.blocks_at_budget]
            capacity_fig.update_layout(title_text=f"Sequences that fit in {self.budget.value:g} GiB of KV cache")
        q = t[t.index != "auto"]
        with quality_fig.batch_update():
            quality_fig.data[0].x, quality_fig.data[0].y = list(q.bytes_per_token), list(q.kl_mean)
            quality_fig.data[0].text = [f"{f}: top-1 {a:.3f}" for f, a in zip(q.index, q.top1_agreement, strict=True)]
            quality_fig.data[0].marker.color = [SELECTED if f == chosen else "#1f77b4" for f in q.index]
        row = t.loc[chosen]
        scales = f", {int(row.scale_bytes):,} of them scales" if row.scale_bytes else ""
        quality = ("the reference itself" if chosen == "auto" else
                   f"mean KL {row.kl_mean:.2e} nats, top-1 agreement {row.top1_agreement:.3f}, perplexity "
                   f"{row.perplexity:.2f} (fp32 cache {row.perplexity_reference:.2f})")
        self.status.value = (f"<b>{KV_NAMES[chosen]}</b>: {int(row.bytes_per_token):,} bytes per token{scales} "
                             f"({row.vs_fp32:.3f}× fp32); {int(row.blocks_at_budget):,} blocks of {BLOCK_SIZE} in "
                             f"{self.budget.value:g} GiB = {int(row.sequences_at_budget):,} sequences of "
                             f"{self.context:,} tokens; quality on {self.tokens.value} held-out tokens: {quality}.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        cols = ["bytes_per_token", "data_bytes", "scale_bytes", "vs_fp32", "blocks_at_budget", "sequences_at_budget",
                "kl_mean", "kl_p95", "top1_agreement", "perplexity"]
        return [(f"KV formats at {self.budget.value:g} GiB, quality on {self.tokens.value} held-out tokens",
                 self.table()[cols])]


def weight_variant(model, name: str):
    """The loaded fp32 model in another weight format: a quantized copy, or a bfloat16 copy. The oneDNN-packed
    weights cannot be deep-copied, so the model is unpacked for the copy and packed again."""
    if name == "fp32":
        return model
    packed = any(getattr(m, "packed", None) is not None for m in model.modules())
    model.prepare(pack=False)
    try:
        clone = copy.deepcopy(model)
    finally:
        model.prepare(pack=packed)
    clone = clone.to(torch.bfloat16) if name == "bf16" else quantize_model_weights(clone, name)
    return clone.prepare(pack=packed)


class WeightFormatLab(LabPanel):
    """Batch-1 decode speed and quality (against the fp32 model, fp32 cache) of the chosen weight format, beside
    the fp32 model's; each format is measured the first time it is chosen."""

    def __init__(self, model, tokenizer, *, weights: str = "int8", heldout_tokens: int = 512,
                 decode_tokens: int = 32, repeats: int = 2):
        self.model, self.tokenizer = model, tokenizer
        self.decode_tokens, self.repeats = decode_tokens, repeats
        self.weights = widgets.Dropdown(options=[(v, k) for k, v in WEIGHT_NAMES.items()], value=weights,
                                        description="weights")
        self.ids = heldout_slice(tokenizer, heldout_tokens)
        self.reference = logits_through_cache(model, self.ids, "auto")
        self.rows: dict[str, dict] = {}
        speed, quality = go.Figure(), go.Figure()
        speed.add_bar(name="batch-1 decode")
        speed.update_yaxes(title_text="decode tokens/s (batch 1, best of runs)")
        quality.add_scatter(mode="markers+text", textposition="top center", marker={"size": 14}, name="formats")
        quality.update_xaxes(title_text="weight MiB (allocated)")
        quality.update_yaxes(title_text="top-1 agreement with fp32")
        subtitle = measured_on(model)
        self.speed_fig = style(speed, "Decode speed by weight format", subtitle)
        self.quality_fig = style(quality, "Quality against weight memory", subtitle)
        super().__init__([self.weights], [self.speed_fig, self.quality_fig])
        self.refresh()

    def _measure_one(self, name: str) -> dict:
        variant = weight_variant(self.model, name)
        self.progress(0, 2, f"{name}: {self.decode_tokens} decode tokens x {self.repeats}")
        speed = max(decode_tokens_per_s(variant, self.tokenizer, tokens=self.decode_tokens)
                    for _ in range(self.repeats))
        self.progress(1, 2, f"{name}: teacher-forcing {len(self.ids)} held-out tokens")
        logits = self.reference if name == "fp32" else logits_through_cache(variant, self.ids, "auto")
        return {"weights": name, "weight_bytes_formula": weight_bytes(variant.spec, variant.dtype,
                                                                      getattr(variant, "weight_format", "auto")),
                "weight_bytes_allocated": model_weight_bytes(variant), "decode_tokens_per_s": speed,
                **quality_against(self.reference, logits, self.ids)}

    def measure(self) -> None:
        for name in ("fp32", self.weights.value):
            if name not in self.rows:
                self.rows[name] = self._measure_one(name)
        self.progress.finish(f"measured: {', '.join(self.rows)}")

    @property
    def frame(self) -> pd.DataFrame:
        frame = pd.DataFrame(list(self.rows.values())).set_index("weights")
        frame["speedup_vs_fp32"] = frame["decode_tokens_per_s"] / frame.loc["fp32", "decode_tokens_per_s"]
        frame["bytes_vs_fp32"] = frame["weight_bytes_allocated"] / frame.loc["fp32", "weight_bytes_allocated"]
        return frame

    def draw(self) -> None:
        f, chosen = self.frame, self.weights.value
        colors = [SELECTED if n == chosen else OTHER for n in f.index]
        with self.speed_fig.batch_update():
            self.speed_fig.data[0].x = [WEIGHT_NAMES[n] for n in f.index]
            self.speed_fig.data[0].y = list(f.decode_tokens_per_s)
            self.speed_fig.data[0].marker.color = colors
            self.speed_fig.data[0].text = [f"{s:.2f}×" for s in f.speedup_vs_fp32]
        with self.quality_fig.batch_update():
            self.quality_fig.data[0].x = list(f.weight_bytes_allocated / MiB)
            self.quality_fig.data[0].y = list(f.top1_agreement)
            self.quality_fig.data[0].text = [WEIGHT_NAMES[n] for n in f.index]
            self.quality_fig.data[0].marker.color = colors
        row = f.loc[chosen]
        self.status.value = (f"<b>{WEIGHT_NAMES[chosen]}</b>: {row.weight_bytes_allocated / MiB:,.0f} MiB of weights "
                             f"({row.bytes_vs_fp32:.2f}× fp32), batch-1 decode {row.decode_tokens_per_s:.1f} tokens/s "
                             f"({row.speedup_vs_fp32:.2f}× fp32); against fp32 on {len(self.ids)} held-out tokens: "
                             f"top-1 agreement {row.top1_agreement:.3f}, mean KL {row.kl_mean:.2e} nats.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        cols = ["weight_bytes_formula", "weight_bytes_allocated", "bytes_vs_fp32", "decode_tokens_per_s",
                "speedup_vs_fp32", "kl_mean", "top1_agreement", "perplexity"]
        return [("Weight formats measured so far (batch 1, fp32 KV cache)", self.frame[cols])]


class ActivationLab(LabPanel):
    """One layer's real inputs through int8 weights four ways (`workbench.lab.ch06.activations`)."""

    def __init__(self, model, tokenizer, *, layer: int = 15, projection: str = "down_proj", tokens: int = 256):
        self.model, self.ids = model, heldout_slice(tokenizer, tokens)
        self.layer = widgets.IntSlider(value=layer, min=0, max=model.spec.num_layers - 1, description="layer")
        self.projection = widgets.Dropdown(options=list(PROJECTIONS), value=projection, description="input of")
        fig = go.Figure()
        fig.add_bar(name="relative output error")
        fig.update_yaxes(title_text="‖y − y_float‖ / ‖y_float‖ (log)", type="log")
        self.figure = style(fig, "Rounding activations as well as weights", measured_on(model))
        super().__init__([self.layer, self.projection], [fig])
        self.refresh()

    def measure(self) -> None:
        x, weight = capture_inputs(self.model, self.ids, self.layer.value, self.projection.value)
        self.errors, self.spread = rounding_errors(x, weight), spread(x, weight)

    def draw(self) -> None:
        with self.figure.batch_update():
            self.figure.data[0].x = list(self.errors.index)
            self.figure.data[0].y = list(self.errors.relative_error)
        e, s = self.errors.relative_error, self.spread
        self.status.value = (f"Layer {self.layer.value} {self.projection.value}: int8 weights alone err by "
                             f"{e.iloc[0]:.2%}; adding 7-bit per-tensor activations {e.iloc[1]:.2%} "
                             f"({e.iloc[1] / e.iloc[0]:.1f}×). The largest token's max |x| is "
                             f"{s['token_max_over_median']:.0f}× the median token's (the first token: "
                             f"{s['first_token_over_median']:.0f}×), the largest input channel "
                             f"{s['channel_max_over_median']:.0f}× the median; the weight's rows only "
                             f"{s['weight_row_max_over_median']:.1f}×.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [("Relative error of the layer's output against the float layer", self.errors)]


SWEEP_METRICS = {"kl_mean": "mean KL vs fp32/fp32 (nats, log)", "top1_agreement": "top-1 agreement with fp32/fp32",
                 "perplexity": "perplexity on held-out text", "recall@2048": "recall at 2,048 tokens"}


class SweepLab(LabPanel):
    """The cached sweep of every weight x KV configuration (`benchmarks/bench_weight_quant.py`): quality against
    the memory one 2,048-token sequence needs (weights + its KV), the metric picked by a control."""

    def __init__(self, *, metric: str = "kl_mean", context: int = 2048, path: Path = SWEEP_PATH):
        self.sweep, self.meta = load_sweep(path)
        self.context = context
        self.metric = widgets.Dropdown(options=[(v, k) for k, v in SWEEP_METRICS.items()], value=metric,
                                       description="quality")
        fig = go.Figure()
        fig.update_xaxes(title_text=f"MiB for weights + the KV of one {context:,}-token sequence")
        self.figure = style(fig, "Every weight × KV configuration (cached sweep)",
                            f"CACHED: measured by `{self.meta['command']}` on {self.meta['date']} · "
                            f"{self.meta['machine']} · SmolLM2-135M-Instruct (dequantized Q4_1)", height=480)
        super().__init__([], [fig], redraw_only=[self.metric])
        self.refresh()

    def measure(self) -> None:
        s = self.sweep.copy()
        s["memory_mib"] = (s.weight_bytes + s.kv_bytes_per_token * self.context) / MiB
        s["weight_label"] = [WEIGHT_NAMES["bf16" if d == "bfloat16" else "fp32" if w == "auto" else w]
                             for w, d in zip(s.weights, s.dtype, strict=True)]
        s["config"] = s.weight_label + " weights, " + s.kv_format + " KV"
        self.frame = s

    def draw(self) -> None:
        metric, s = self.metric.value, self.frame
        self.figure.data = []
        for weights, group in s.groupby("weight_label", sort=False):
            self.figure.add_scatter(x=group.memory_mib, y=group[metric], mode="markers+text", name=weights,
                                    text=group.kv_format, textposition="top center", marker={"size": 12})
        self.figure.update_yaxes(title_text=SWEEP_METRICS[metric], type="log" if metric == "kl_mean" else "linear")
        best = s[s.kv_format != "auto"].sort_values("memory_mib").iloc[0]
        self.status.value = (f"Cached sweep ({self.meta['date']}, {len(s)} configurations): the smallest, "
                             f"<b>{best.config}</b>, needs {best.memory_mib:,.0f} MiB for one {self.context:,}-token "
                             f"sequence against {s.memory_mib.max():,.0f} MiB for fp32/fp32, at "
                             f"{SWEEP_METRICS[metric].split(' (')[0]} {best[metric]:.4g}.")

    def layered_table(self) -> pd.DataFrame:
        cols = ["config", "weight_bytes", "kv_bytes_per_token", "blocks_at_budget", "max_concurrency",
                "decode_tokens_per_s", "throughput_tokens_per_s", "kl_mean", "top1_agreement", "perplexity",
                *[c for c in self.frame.columns if c.startswith("recall@")]]
        return self.frame[[c for c in cols if c in self.frame.columns]].set_index("config")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        return [("The layered table, measured (cached sweep; blocks and sequences at 1 GiB of KV, 2,048 tokens each)",
                 self.layered_table())]
