"""Chapter 5 on a GPU: what a decode batch costs on an H200, where the learner's CPU has long since saturated.

Batching pays while a step is bound by reading the weights: more sequences share one read. On a laptop CPU the
ridge is a few FLOP per byte, so a handful of sequences already make the step arithmetic-bound and the step
time grows with the batch; on a GPU whose ridge is ~180 FLOP per byte the step time barely moves for dozens of
sequences. The sweep ran to a batch of 256 (its largest batch, so the knee it finds below that is the
device's, not the cap's). Llama-3-8B shape, bf16, CUDA graphs and the fused kernels, 128-token prompts.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.lab.kit.figures import style
from workbench.lab.kit.gpu_beside import GpuBeside
from workbench.lab.kit.gpu_results import GpuResult

KNEE_GROWTH = 1.25  # the knee: the first batch whose step takes 25% longer than a batch of one


def knee(runs: pd.DataFrame, growth: float = KNEE_GROWTH) -> int | None:
    """The smallest batch whose decode step costs ``growth`` times the batch-1 step (None: none in the sweep)."""
    one = float(runs.loc[runs["batch"] == runs["batch"].min(), "ms_per_step"].iloc[0])
    slower = runs[runs["ms_per_step"] >= growth * one]
    return int(slower["batch"].min()) if not slower.empty else None


def _builder(cpu_sweep):
    def build(result: GpuResult) -> tuple[go.Figure, list[str]]:
        runs = pd.DataFrame(result.measurement["runs"]).sort_values("batch")
        fig = make_subplots(specs=[[{"secondary_y": True}]])
        fig.add_trace(go.Scatter(x=runs["batch"], y=runs["tokens_per_s"], name="tokens/s (all sequences)",
                                 mode="lines+markers"), secondary_y=False)
        fig.add_trace(go.Scatter(x=runs["batch"], y=runs["ms_per_step"], name="ms per decode step",
                                 mode="lines+markers", line={"dash": "dot"}), secondary_y=True)
        fig.update_xaxes(type="log", title_text="sequences decoding together (batch)", tickvals=list(runs["batch"]))
        fig.update_yaxes(title_text="tokens/s", type="log", secondary_y=False)
        fig.update_yaxes(title_text="ms per step", rangemode="tozero", secondary_y=True)
        style(fig, "Decode throughput and step time by batch on a GPU", f"{result.label}, Llama-3-8B shape")
        one, last = runs.iloc[0], runs.iloc[-1]
        at64 = runs[runs["batch"] == 64]
        found = knee(runs)
        cheap = int(runs.loc[runs["ms_per_step"] < KNEE_GROWTH * one["ms_per_step"], "batch"].max())
        cap = int(result.measurement.get("max_num_seqs_cap", last["batch"]))
        sentences = [
            f"On the {result.device}, going from 1 to {int(last['batch'])} sequences multiplies throughput by "
            f"**{last['tokens_per_s'] / one['tokens_per_s']:.0f}x** ({one['tokens_per_s']:,.0f} → "
            f"{last['tokens_per_s']:,.0f} tokens/s) while a step grows from {one['ms_per_step']:.1f} to "
            f"{last['ms_per_step']:.1f} ms"
            + (f"; at 64 sequences a step costs "
               f"{float(at64['ms_per_step'].iloc[0]) / one['ms_per_step']:.2f}x a single sequence's."
               if not at64.empty else "."),
            (f"A step stops being nearly free (it costs {KNEE_GROWTH:.2f}x the batch-1 step) at **{found} "
             f"sequences**, below the largest batch run ({cap}): the device sets that, not the cap; throughput "
             "itself still grows past it." if found and found < cap else
             f"No knee within the sweep: its largest batch ({cap}) sets the limit of what was seen.")]
        if cpu_sweep is not None:
            k = cpu_sweep.knee("continuous")
            sentences.append(
                "The sweep above is a different measurement (users sending requests, throughput per added level) "
                "on a different model, so only the shape compares: "
                + (f"on this device continuous batching's throughput stopped growing by {cpu_sweep.gain:.0%} a "
                   f"level at {k['concurrency']:.0f} users, "
                   if k is not None else "on this device the sweep found no knee, ")
                + f"while on the GPU a step of {cheap} sequences still cost less than {KNEE_GROWTH:.2f}x a single "
                  "one: where batching stops being nearly free moves with the ridge.")
        return fig, sentences
    return build


def on_gpu(cpu_sweep=None) -> GpuBeside:
    """The stored GPU batch sweep; ``cpu_sweep``: this chapter's `ConcurrencySweep` on this device."""
    return GpuBeside.build("ch05", _builder(cpu_sweep))
