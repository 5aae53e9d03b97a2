"""A chapter's GPU measurement shown beside the learner's own: a stored figure and sentences computed from both.

Why it exists: several of the workbench's lessons turn on where a device's ridge point sits, and a laptop CPU and a
datacenter GPU put it 30-50x apart. Each chapter that has a stored GPU result file
(`workbench.lab.kit.gpu_results`) builds a figure and its sentences from that file and, where the notebook
passes them, from the numbers it just measured on the learner's device; this module only shows the result the
same way everywhere: the figure (stored like a panel's, so it reads without a kernel), then the sentences, then
where the numbers come from (device, dtype, date, command). With no stored file it says how to make one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import plotly.graph_objects as go

from workbench.lab.kit.gpu_results import GpuResult, latest_gpu_result
from workbench.lab.kit.notebook import say
from workbench.lab.kit.stored import show_figure
from workbench.paths import REPO_ROOT

Builder = Callable[[GpuResult], tuple[go.Figure, list[str]]]


@dataclass
class GpuBeside:
    """What a chapter shows from its newest GPU file (``result`` None: no GPU has measured it yet)."""

    chapter: str
    result: GpuResult | None
    figure: go.Figure | None
    sentences: list[str]

    @classmethod
    def build(cls, chapter: str, builder: Builder) -> GpuBeside:
        result = latest_gpu_result(chapter)
        if result is None:
            return cls(chapter, None, None, [])
        figure, sentences = builder(result)
        return cls(chapter, result, figure, sentences)

    @property
    def source(self) -> str:
        if self.result is None:
            return (f"No GPU measurement of this chapter is stored yet. On a machine with a CUDA GPU, "
                    f"`python benchmarks/gpu_chapters.py --chapter {self.chapter}` writes one into "
                    "`datasets/gpu_results/`, and this cell draws it.")
        r = self.result
        path = r.path.relative_to(REPO_ROOT) if r.path.is_relative_to(REPO_ROOT) else r.path
        versions = ", ".join(f"{k} {v}" for k, v in r.versions.items())
        note = f" {r.note[0].upper()}{r.note[1:]}." if r.note else ""
        return (f"*Measured on {r.label}, random weights of the real shapes (speed does not depend on their "
                f"values), {versions}; `{path}`, made by `{r.command}`.{note}*")

    @property
    def text(self) -> str:
        return " ".join([*self.sentences, self.source])

    def _ipython_display_(self) -> None:
        if self.figure is not None:
            show_figure(self.figure)
        say(self.text)
