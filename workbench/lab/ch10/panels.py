"""Chapter 10's panels: which products round with the batch, the same prompt among varying traffic with the
batch-invariant mode off and on, and what the mode costs; plus the cached 200-run figure."""

from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.lab.ch10.runs import live_divergence, product_check, summary, throughput_cost
from workbench.lab.kit.figures import style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel

MODE_NAMES = {False: "default", True: "batch-invariant"}
COLORS = {False: "#d62728", True: "#2ca02c"}


class ProductsLab(LabPanel):
    """Each linear layer's first row computed alone and inside a batch of M rows: the largest difference."""

    def __init__(self, model):
        self.model, self.subtitle = model, measured_on(model)
        self.rows = widgets.Dropdown(options=[2, 8, 32, 128], value=8, description="rows in batch")
        super().__init__([self.rows], [go.Figure()])

    def measure(self):
        return product_check(self.model, batch_sizes=(self.rows.value,))

    def draw(self) -> None:
        check, (fig,) = self.result, self.figures
        frame = check.frame
        with fig.batch_update():
            fig.data = []
            fig.add_bar(name="default", x=frame["layer"], y=frame["max_abs_diff"], marker_color=COLORS[False])
            fig.add_bar(name="batch-invariant", x=frame["layer"],
                        y=[0.0 if same else float("nan") for same in frame["identical in the mode"]],
                        marker_color=COLORS[True])
            fig.update_layout(barmode="group", yaxis_title="largest |difference| of the row's outputs")
            style(fig, f"One row alone vs the same row among {self.rows.value}: which products round differently",
                  self.subtitle, height=360)
        differ = check.layers_that_differ
        self.status.value = (f"With {self.rows.value} rows in the batch, {len(differ)} of {len(frame)} layers give "
                             f"the row other bits ({', '.join(differ) or 'none'}; largest difference "
                             f"{frame['max_abs_diff'].max():.2g}); in the batch-invariant mode "
                             f"{'none does' if check.mode_is_identical else 'some still do'}.")

    def stored_tables(self):
        return [("per layer", self.result.frame)]


class DivergenceLab(LabPanel):
    """The same greedy prompt among 0..N other requests, compared with the prompt decoded alone: mode off and on."""

    def __init__(self, model, tokenizer, prompt_ids: list[int], *, runs: int = 12, max_tokens: int = 32,
                 kv_format: str = "int4"):
        self.model, self.tokenizer, self.prompt_ids = model, tokenizer, prompt_ids
        self.subtitle = measured_on(model)
        self.kv_format = widgets.Dropdown(options=["auto", "int8", "int4"], value=kv_format, description="KV format")
        self.runs = widgets.IntSlider(value=runs, min=4, max=60, description="runs")
        self.max_tokens = widgets.IntSlider(value=max_tokens, min=8, max=96, step=8, description="tokens")
        self.max_others = widgets.IntSlider(value=15, min=0, max=15, description="max others")
        super().__init__([self.kv_format, self.runs, self.max_tokens, self.max_others], [go.Figure(), go.Figure()])

    def measure(self):
        return live_divergence(self.model, self.tokenizer, self.prompt_ids, runs=self.runs.value,
                               max_tokens=self.max_tokens.value, max_others=self.max_others.value,
                               kv_cache_dtype=self.kv_format.value, progress=self.progress)

    def summaries(self) -> dict[bool, dict]:
        return {mode: summary(report) for mode, report in self.result.items()}

    def draw(self) -> None:
        steps, counts = self.figures
        with steps.batch_update():
            steps.data = []
            for mode, report in self.result.items():
                runs = report.runs
                for column, symbol in (("first_logit_difference", "circle-open"), ("first_token_divergence", "x")):
                    shown = runs[column].notna()
                    steps.add_scatter(name=f"{MODE_NAMES[mode]}: {column.replace('_', ' ')}", mode="markers",
                                      x=runs.loc[shown, "others"], y=runs.loc[shown, column],
                                      marker={"color": COLORS[mode], "symbol": symbol, "size": 10})
            steps.update_layout(xaxis_title="other requests sharing the engine",
                                yaxis_title="first step that differs from the prompt alone")
            style(steps, "Where the same greedy prompt first differs from its answer alone", self.subtitle)
        sums = self.summaries()
        with counts.batch_update():
            counts.data = []
            counts.add_bar(name="distinct completions", x=[MODE_NAMES[m] for m in sums],
                           y=[s["distinct_completions"] for s in sums.values()], marker_color=list(COLORS.values()))
            counts.add_bar(name="runs whose logits differ", x=[MODE_NAMES[m] for m in sums],
                           y=[s["runs_with_other_logits"] for s in sums.values()], marker_color="#7f7f7f")
            counts.update_layout(barmode="group", yaxis_title=f"of {self.runs.value} runs")
            style(counts, f"{self.runs.value} greedy runs, KV {self.kv_format.value}", self.subtitle, height=340)
        off, on = sums[False], sums[True]
        forms = off["distinct_completions"]
        self.status.value = (f"KV {self.kv_format.value}, {off['runs']} runs: default — {forms} "
                             f"distinct completion{'' if forms == 1 else 's'}, logits differ in "
                             f"{off['runs_with_other_logits']} runs "
                             f"(largest gap {off['max_logit_gap']:.2g}); batch-invariant — "
                             f"{on['distinct_completions']} distinct, logits differ in "
                             f"{on['runs_with_other_logits']} runs.")

    def stored_tables(self):
        return [("per mode", pd.DataFrame(self.summaries().values()))]


class ModeCostLab(LabPanel):
    """Output tokens per second of the same requests with the mode off and on, alternating, warm-up excluded."""

    def __init__(self, model, tokenizer, prompts: list[list[int]], *, max_tokens: int = 16):
        self.model, self.tokenizer, self.all_prompts = model, tokenizer, prompts
        self.subtitle = measured_on(model)
        self.requests = widgets.IntSlider(value=min(4, len(prompts)), min=1, max=len(prompts), description="requests")
        self.max_tokens = max_tokens
        super().__init__([self.requests], [go.Figure()])

    def measure(self) -> pd.DataFrame:
        return throughput_cost(self.model, self.tokenizer, self.all_prompts[:self.requests.value],
                               max_tokens=self.max_tokens, progress=self.progress)

    @property
    def ratio(self) -> float:
        medians = self.result.groupby("batch_invariant")["tokens_per_s"].median()
        return float(medians[True] / medians[False])

    def draw(self) -> None:
        frame, (fig,) = self.result, self.figures
        with fig.batch_update():
            fig.data = []
            for mode in (False, True):
                rows = frame[frame["batch_invariant"] == mode]
                fig.add_bar(name=MODE_NAMES[mode], x=[f"pass {p}" for p in rows["pass"]], y=rows["tokens_per_s"],
                            marker_color=COLORS[mode])
            fig.update_layout(barmode="group", yaxis_title="output tokens/s")
            style(fig, f"What the mode costs: {self.requests.value} requests, {self.max_tokens} tokens each",
                  self.subtitle, height=340)
        self.status.value = (f"Batch-invariant decoding runs at {self.ratio:.2f}x the default's throughput "
                             f"(medians of {frame['pass'].nunique()} passes each, warm-up excluded).")


def cached_divergence_figure(frame: pd.DataFrame, result: dict) -> go.Figure:
    """Distinct completions over the cached runs, per KV format, mode off and on."""
    fig = go.Figure()
    for mode in (False, True):
        rows = frame[frame["batch_invariant"] == mode]
        fig.add_bar(name=MODE_NAMES[mode], x=rows["kv_cache_dtype"], y=rows["distinct_completions"],
                    marker_color=COLORS[mode])
    fig.update_layout(barmode="group", yaxis_title=f"distinct completions of {int(frame['runs'].max())} runs",
                      xaxis_title="KV format")
    machine = result["machine"]
    torch_version = f"torch {result['versions']['torch']}"
    label = machine if torch_version in machine else f"{machine}, {torch_version}"
    return style(fig, f"The same greedy prompt, {int(frame['runs'].max())} times among varying traffic",
                 f"{label}, {result['date']}; one thread, so no thread races in these runs")
