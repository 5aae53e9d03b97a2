"""Chapter 7's sweeps: speedup against K, speedup against batch size, and the sampling check.

``KSweepLab`` runs one proposer at several K beside plain decoding and draws the speedup model
E(α, K) / (r(K) + K·c) through the measurements, with α and c pooled from the runs and r(K) from the measured
forward curve; ``BatchLab`` runs both proposers at batch 1, 4 and 16 and sets each measured speedup beside the
model at that batch (where verification stops being free); ``SamplingLab`` is the chi-square check that
speculative sampling leaves the distribution unchanged (`workbench.spec_experiments.sampling_check`).
"""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.lab.ch07.panels import COLORS, k_control, proposer_control, task_control
from workbench.lab.ch07.runs import BatchRun, batch_run
from workbench.lab.kit.figures import set_trace, style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel
from workbench.spec.theory import best_k, speedup
from workbench.spec_experiments.compare import Comparison, compare
from workbench.spec_experiments.forward_cost import ForwardCurve
from workbench.spec_experiments.methods import PLAIN, PROPOSERS, task_prompts
from workbench.spec_experiments.sampling_check import CHECK_PROPOSERS, VOCAB, SamplingCheck, sampling_check

K_MAX = 12
MEASURED, MODEL, TEXTBOOK, BEST = ("measured", "model: E ÷ (r(K) + K·c), r from the forward curve",
                                   "textbook: E ÷ (1 + K·c)", "model's best K")
SAMPLES, TARGET, DRAFT = ("speculative samples (share)", "target, exact",
                          "draft model, exact (what a wrong rule would follow)")


class KSweepLab(LabPanel):
    """Measured speedup at several K, and the model's curve through them with its best K."""

    def __init__(self, model, tokenizer, draft, curve: ForwardCurve, *, proposer: str = "prompt lookup",
                 task: str = "grounded", ks: tuple[int, ...] = (1, 2, 4, 8), num_prompts: int = 1,
                 max_tokens: int = 48):
        self.model, self.tokenizer, self.draft, self.curve = model, tokenizer, draft, curve
        self.ks, self.num_prompts, self.max_tokens = ks, num_prompts, max_tokens
        self.proposer, self.task = proposer_control(proposer), task_control(task)
        fig = go.Figure()
        fig.add_scatter(name=MEASURED, mode="markers+lines", marker={"size": 10})
        fig.add_scatter(name=MODEL, mode="lines",
                        line={"dash": "dash", "color": "#bcbd22"})
        fig.add_scatter(name=TEXTBOOK, mode="lines", line={"dash": "dot", "color": "#17becf"})
        fig.add_scatter(name=BEST, mode="markers", marker={"symbol": "star", "size": 16,
                                                                        "color": "#d62728"})
        fig.update_xaxes(title_text="K (drafts per pass)", dtick=1)
        fig.update_yaxes(title_text="decode speed ÷ plain decoding", rangemode="tozero")
        style(fig, "Speedup against K", measured_on(model))
        self.figure = fig
        super().__init__([self.proposer, self.task], [fig])

    def labels(self) -> list[str]:
        return [f"{self.proposer.value}, K={k}" for k in self.ks]

    def measure(self) -> Comparison:
        return compare(self.model, self.tokenizer, task_prompts(self.task.value, self.num_prompts),
                       [(self.proposer.value, k) for k in self.ks], max_tokens=self.max_tokens,
                       draft=self.draft, progress=self.progress)

    @property
    def comparison(self) -> Comparison:
        return self.result

    @property
    def alpha(self) -> float:
        return self.comparison.pooled(self.labels())[0]

    @property
    def c(self) -> float:
        return self.comparison.pooled(self.labels())[1]

    def model_curve(self, verify_cost=None) -> list[float]:
        cost = self.curve.verify_cost(1) if verify_cost is None else verify_cost
        return [speedup(self.alpha, k, self.c, cost) for k in range(K_MAX + 1)]

    def best(self) -> tuple[int, float]:
        return best_k(self.alpha, self.c, k_max=K_MAX, verify_cost=self.curve.verify_cost(1))

    def draw(self) -> None:
        summary = self.comparison.summary().loc[self.labels()]
        k_best, s_best = self.best()
        with self.figure.batch_update():
            set_trace(self.figure, MEASURED, x=list(self.ks), y=summary["speedup"],
                      marker={"color": COLORS[self.proposer.value]})
            set_trace(self.figure, MODEL, x=list(range(K_MAX + 1)), y=self.model_curve())
            set_trace(self.figure, TEXTBOOK, x=list(range(K_MAX + 1)), y=self.model_curve(1.0))
            set_trace(self.figure, BEST, x=[k_best], y=[s_best])
            self.figure.layout.title.text = (f"Speedup against K: {self.proposer.value} on {self.task.value} "
                                             f"(pooled α = {self.alpha:.2f}, c = {self.c:.3f})")
        top = summary["speedup"].idxmax()
        self.status.value = (
            f"Measured: best of K = {list(self.ks)} is <b>K = {summary.loc[top, 'K']}</b> "
            f"({summary.loc[top, 'speedup']:.2f}x; plain {self.comparison.plain.tokens_per_s:.1f} tokens/s). Model "
            f"with the pooled α = {self.alpha:.2f}, c = {self.c:.3f} and the measured r(K): best <b>K = {k_best}"
            f"</b> ({s_best:.2f}x); with verification assumed free it would keep rising to "
            f"K = {best_k(self.alpha, self.c, k_max=K_MAX)[0]}.")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        columns = ["K", "speedup", "alpha", "accepted_per_drafted", "tokens_per_pass", "tokens_per_pass_theory",
                   "draft_cost_c", "verify_cost_r", "speedup_model"]
        return [("Per K (measured; model from this run's α, c, r)", self.comparison.summary().loc[self.labels(),
                                                                                                 columns])]


class BatchLab(LabPanel):
    """Both proposers at batch 1, 4 and 16: measured speedups beside the model with r measured at each batch."""

    def __init__(self, model, tokenizer, draft, curve: ForwardCurve, *, task: str = "open chat", k: int = 4,
                 batches: tuple[int, ...] = (1, 4, 16), max_tokens: int = 16):
        self.model, self.tokenizer, self.draft, self.curve = model, tokenizer, draft, curve
        self.batches, self.max_tokens = batches, max_tokens
        self.task, self.k = task_control(task), k_control(k)
        speed = go.Figure()
        for label in PROPOSERS:
            speed.add_scatter(name=f"{label}: measured", mode="lines+markers", line={"color": COLORS[label]},
                              marker={"size": 10})
            speed.add_scatter(name=f"{label}: model, r at that batch", mode="lines",
                              line={"color": COLORS[label], "dash": "dash"})
        speed.update_xaxes(title_text="sequences decoding together (batch)", type="log", tickvals=list(batches))
        speed.update_yaxes(title_text="decode speed ÷ plain decoding", rangemode="tozero")
        style(speed, "Speedup against batch size", measured_on(model))
        rate = go.Figure()
        for label in (PLAIN, *PROPOSERS):
            rate.add_bar(name=label, marker_color=COLORS[label])
        rate.update_xaxes(title_text="batch", type="category")
        rate.update_yaxes(title_text="decode tokens/s (all sequences)")
        style(rate, "Decode throughput by batch size", measured_on(model), height=360)
        self.speed_figure, self.rate_figure = speed, rate
        super().__init__([self.task, self.k], [speed, rate])

    def measure(self) -> BatchRun:
        return batch_run(self.model, self.tokenizer, self.draft, self.curve, task=self.task.value, k=self.k.value,
                         batches=self.batches, max_tokens=self.max_tokens, progress=self.progress)

    def frame(self) -> pd.DataFrame:
        """One row per (batch, method): decode tokens/s, speedup, α, c, r and the model's speedup."""
        return self.result.frame

    def draw(self) -> None:
        frame = self.frame()
        with self.speed_figure.batch_update():
            for label in PROPOSERS:
                rows = frame[frame["method"] == label]
                set_trace(self.speed_figure, f"{label}: measured", x=rows["batch"], y=rows["speedup"])
                set_trace(self.speed_figure, f"{label}: model, r at that batch", x=rows["batch"],
                          y=rows["speedup_model"])
            self.speed_figure.layout.title.text = f"Speedup against batch size: {self.task.value}, K={self.k.value}"
            self.speed_figure.layout.shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 1,
                                                "y1": 1, "line": {"color": "black", "dash": "dot"}}]
        with self.rate_figure.batch_update():
            for bar in self.rate_figure.data:
                rows = frame[frame["method"] == bar.name]
                bar.x, bar.y = [str(b) for b in rows["batch"]], rows["decode_tokens_per_s"]
        pivot = frame.pivot(index="method", columns="batch", values="speedup")
        parts = [f"{label} " + " → ".join(f"{pivot.loc[label, b]:.2f}x" for b in self.batches)
                 for label in PROPOSERS]
        self.status.value = (f"Speedup at batch {' / '.join(map(str, self.batches))}: <b>" + "</b>; <b>".join(parts)
                             + f"</b>. Verifying K={self.k.value} drafts costs r = "
                             + " / ".join(f"{self.curve.ratio(b * (self.k.value + 1), b):.2f}" for b in self.batches)
                             + " plain forwards at these batch sizes (forward curve).")

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        frame = self.frame().set_index(["batch", "method"])
        frame["same_as_plain"] = frame["same_as_plain"].astype(str)
        return [("Per batch size and method (decode phase)", frame)]


class SamplingLab(LabPanel):
    """Speculative samples of tokens 2 and 3 against the exact target distribution (tiny random models)."""

    def __init__(self, *, proposer: str = "draft model", temperature: float = 1.0, samples: int = 2000):
        self.proposer = widgets.ToggleButtons(options=list(CHECK_PROPOSERS), value=proposer, description="proposer")
        self.temperature = widgets.Dropdown(options=[0.7, 1.0, 1.5], value=temperature, description="temperature")
        self.samples = widgets.Dropdown(options=[1000, 2000, 4000], value=samples, description="samples")
        fig = go.Figure()
        fig.add_bar(name=SAMPLES, marker_color="#1f77b4")
        fig.add_scatter(name=TARGET, mode="markers", marker={"symbol": "line-ew-open", "size": 18,
                                                                       "color": "black", "line": {"width": 3}})
        fig.add_scatter(name=DRAFT, mode="markers",
                        marker={"symbol": "x", "size": 8, "color": "#d62728"})
        fig.update_xaxes(title_text="(token 2, token 3), most likely first", type="category")
        fig.update_yaxes(title_text="probability")
        style(fig, "Speculative sampling keeps the target's distribution",
              "tiny 6-token models with random weights, enumerated exactly; CPU · float32", height=380)
        self.figure = fig
        super().__init__([self.proposer, self.temperature, self.samples], [fig])

    def measure(self) -> SamplingCheck:
        self.progress(0, 1, "sampling")
        check = sampling_check(self.proposer.value, temperature=self.temperature.value,
                                     samples=self.samples.value)
        self.progress.finish(f"{self.samples.value} samples")
        return check

    def draw(self) -> None:
        r = self.result
        order = r.target.argsort(descending=True).tolist()
        names = [f"{i // VOCAB},{i % VOCAB}" for i in order]
        with self.figure.batch_update():
            set_trace(self.figure, SAMPLES, x=names, y=(r.counts / r.counts.sum())[order].tolist())
            set_trace(self.figure, TARGET, x=names, y=r.target[order].tolist())
            set_trace(self.figure, DRAFT, x=names, y=r.draft[order].tolist())
        verdict = "fit the target" if r.p_value > 1e-3 else "do NOT fit the target"
        self.status.value = (
            f"{r.samples} samples at temperature {r.temperature:g} with {r.proposer} (K=2): {r.drafted} tokens "
            f"drafted, {r.accepted} accepted. Against the exact target: χ² = {r.chi2:.1f} on {r.df} degrees of "
            f"freedom, <b>p = {r.p_value:.2f}</b> — the samples {verdict}. Against the draft model's own "
            f"distribution: p = {r.p_value_vs_draft:.1e}, so the test can tell the two apart.")
