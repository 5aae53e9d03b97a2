"""Chapter 6 on a GPU: each KV format given the same memory, filled with as many sequences as fit, on an H200.

The argument for a smaller KV format is capacity: half the bytes per token, twice the sequences in the same
memory, and (the claim) more throughput. The GPU file tests exactly that: a 2 GiB KV budget, 1,024-token prompts
and 128 new tokens, the batch set by what fits in each format (Llama-3-8B shape, bf16 model, CUDA graphs).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.lab.kit.figures import style
from workbench.lab.kit.gpu_beside import GpuBeside
from workbench.lab.kit.gpu_results import GpuResult

NAMES = {"auto": "bf16", "fp8_e4m3": "fp8 (e4m3)", "int8": "int8", "int4": "int4"}


def _builder():
    def build(result: GpuResult) -> tuple[go.Figure, list[str]]:
        m = result.measurement
        rows = pd.DataFrame(m["formats"])
        names = [NAMES.get(f, f) for f in rows["kv_cache_dtype"]]
        fig = make_subplots(rows=1, cols=2, subplot_titles=["sequences that fit", "decode tokens/s"])
        fig.add_trace(go.Bar(x=names, y=rows["batch_that_fits"], name="sequences that fit"), row=1, col=1)
        fig.add_trace(go.Bar(x=names, y=rows["tokens_per_s"], name="tokens/s"), row=1, col=2)
        style(fig, f"KV formats in the same {m['kv_budget_bytes'] / 2**30:.0f} GiB on a GPU",
              f"{result.label}, Llama-3-8B shape, {m['prompt_tokens']:,}-token prompts", height=400)
        base = rows.iloc[0]
        sentences = [f"On the {result.device}, with {m['kv_budget_bytes'] / 2**30:.0f} GiB for the KV cache, "
                     f"bf16 fits {int(base['batch_that_fits'])} sequences and decodes {base['tokens_per_s']:,.0f} "
                     "tokens/s;"]
        for _, row in rows.iloc[1:].iterrows():
            change = row["tokens_per_s"] / base["tokens_per_s"] - 1
            sentences.append(f"{NAMES.get(row['kv_cache_dtype'])} fits {int(row['batch_that_fits'])} and decodes "
                             f"{row['tokens_per_s']:,.0f} ({change:+.0%});")
        sentences.append("whether the bigger batch pays is not established by this run: its harness warmed up at "
                         "batch 1, and CUDA graphs are captured on first use per batch size, so these step times may "
                         "include a capture (chapter 5's run on the same device timed much faster steps at similar "
                         "batches). The next GPU session warms up at the measured batch; until then, the kernel "
                         "benchmark in RESULTS.md (quantized KV decode attention) is the firmer number: fp8 and "
                         "int8 attention steps cost about as much as bf16's, not less.")
        return fig, sentences
    return build


def on_gpu() -> GpuBeside:
    return GpuBeside.build("ch06", _builder())
