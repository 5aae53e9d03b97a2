"""Chapter 5's panels on what decides the batch: output-length variance (`VarianceLab`), the KV pool against
``max_num_seqs`` (`BatchCapacityLab`) and priorities under overload (`PriorityLab`)."""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.bench.synthetic import random_requests
from workbench.lab.ch05.claims import PriorityRun, priority_run, with_priorities
from workbench.lab.ch05.panels import COLORS, EnginePanel
from workbench.lab.ch05.runs import BatchCapacity, VarianceEffect, capacity_run, variance_effect
from workbench.lab.kit.figures import style


class VarianceLab(EnginePanel):
    """Static vs continuous batching as output lengths spread out (same range, same users)."""

    # 16 requests: with 8 the last long request runs alone in both modes and hides most of static's padding.
    def __init__(self, model, tokenizer, *, requests: int = 16, users: int = 4):
        self.requests = requests
        self.users = widgets.IntSlider(value=users, min=2, max=12, description="users")
        super().__init__(model, tokenizer, [self.users], [go.Figure()])

    def measure(self) -> VarianceEffect:
        return variance_effect(lambda mode: self.engine(mode, max_num_seqs=12), self.requests, (2, 24),
                               users=self.users.value, vocab_size=self.vocab_size, progress=self.progress)

    def draw(self) -> None:
        result: VarianceEffect = self.result
        fig = self.figures[0]
        with fig.batch_update():
            fig.data = []
            for mode in ("static", "continuous"):
                rows = result.frame[result.frame["mode"] == mode]
                fig.add_bar(x=[f"{s} (cv {cv:.2f})" for s, cv in zip(rows["spread"], rows["output_cv"], strict=True)],
                            y=rows["output_tok_s"], name=mode, marker_color=COLORS[mode])
            fig.update_layout(barmode="group", xaxis_title="output lengths (coefficient of variation)",
                              yaxis_title="output tokens/s")
            style(fig, "Output-length variance: static vs continuous batching", self.subtitle, height=380)
        r = result.ratios
        self.status.value = (f"continuous / static throughput: {r['fixed']:.2f}x with equal output lengths, "
                             f"{r['uniform']:.2f}x uniform, {r['log-uniform']:.2f}x log-uniform.")

    def stored_tables(self):
        return [("variance runs", self.result.frame[["spread", "mode", "output_cv", "steps", "output_tok_s",
                                                     "e2e_p50_ms", "e2e_max_ms"]].round(2))]


class BatchCapacityLab(EnginePanel):
    """``max_num_seqs`` against the KV pool: how many sequences really run together as the pool shrinks."""

    def __init__(self, model, tokenizer, *, requests: int = 4, pools: tuple[int, ...] = (2, 4, 8)):
        self.workload = random_requests(requests, prompt_tokens=24, output_tokens=(8, 8), seed=3, spread="fixed",
                                        vocab_size=model.spec.vocab_size)
        self.max_seqs = widgets.IntSlider(value=4, min=2, max=16, description="max_num_seqs")
        self.pools = pools
        super().__init__(model, tokenizer, [self.max_seqs], [go.Figure()])

    def measure(self) -> BatchCapacity:
        return capacity_run(lambda n: self.engine("continuous", max_num_seqs=self.max_seqs.value, num_blocks=n),
                            self.workload, self.pools, progress=self.progress)

    def draw(self) -> None:
        result: BatchCapacity = self.result
        fig, t = self.figures[0], result.frame
        with fig.batch_update():
            fig.data = []
            fig.add_scatter(x=t["num_blocks"], y=t["bound"], name="min(max_num_seqs, blocks / blocks per sequence)",
                            mode="lines", line_dash="dash")
            fig.add_scatter(x=t["num_blocks"], y=t["peak_batch"], name="largest batch measured", mode="markers",
                            marker_size=12)
            fig.update_layout(xaxis_title="KV blocks in the pool (16 tokens each)", yaxis_title="sequences per step")
            style(fig, "The KV pool bounds the batch, not max_num_seqs alone", self.subtitle, height=380)
        small, large = result.row(0), result.row(-1)
        self.status.value = (f"With {small['num_blocks']} blocks and {small['blocks_per_seq']} blocks per sequence "
                             f"the batch peaked at {small['peak_batch']} although max_num_seqs is "
                             f"{small['max_num_seqs']}; with {large['num_blocks']} blocks it reached "
                             f"{large['peak_batch']}.")

    def stored_tables(self):
        return [("capacity runs", self.result.frame.round(2))]


class PriorityLab(EnginePanel):
    """Overload with interactive (priority 0) and batch (priority 1) requests: FCFS against priority scheduling."""

    def __init__(self, model, tokenizer, *, requests: int = 9, max_num_seqs: int = 3, num_blocks: int = 7):
        self.workload = with_priorities(random_requests(requests, prompt_tokens=24, output_tokens=(4, 16), seed=4,
                                                        vocab_size=model.spec.vocab_size))
        self.rate = widgets.Dropdown(options={"all at once": None, "8 req/s Poisson": 8.0}, value=None,
                                     description="arrivals")
        self.limits = {"max_num_seqs": max_num_seqs, "num_blocks": num_blocks}
        super().__init__(model, tokenizer, [self.rate], [go.Figure()])

    def measure(self) -> PriorityRun:
        return priority_run(lambda policy: self.engine("continuous", scheduling_policy=policy, **self.limits),
                            self.workload, rate=self.rate.value)

    def draw(self) -> None:
        result: PriorityRun = self.result
        fig = self.figures[0]
        with fig.batch_update():
            fig.data = []
            for cls, color in (("interactive", "#2ca02c"), ("batch", "#7f7f7f")):
                rows = result.frame[result.frame["class"] == cls]
                fig.add_bar(x=rows["policy"], y=rows["ttft_p50_ms"], name=f"{cls} TTFT p50", marker_color=color)
            fig.update_layout(barmode="group", yaxis_title="TTFT p50 (ms)")
            style(fig, "Priorities under overload: interactive vs batch requests", self.subtitle, height=380)
        cell = result.cell
        reading = result.reading()
        self.status.value = (f"{reading[0].upper()}{reading[1:]}; batch requests "
                             f"{cell('fcfs', 'batch', 'ttft_p50_ms'):.0f} -> "
                             f"{cell('priority', 'batch', 'ttft_p50_ms'):.0f} ms, preempted "
                             f"{cell('priority', 'batch', 'preemptions'):.0f} times under priority.")

    def stored_tables(self):
        return [("by policy and class", self.result.frame.drop(columns="ttft_ms_all").round(1))]
