"""What every chapter's lab shares: the plotly renderer pin, labels saying what a figure was measured on,
a progress bar for long measurements, figure styling, and the panel that ties controls to stored figures.

The renderer is pinned because plotly otherwise picks one from the environment, and notebooks saved from
different front ends would then store different MIME types (and some embed all of plotly.js). The panel
exists so that every control in every chapter behaves the same way: changing it disables the controls,
re-runs the measurement with a progress bar, and redraws the same figures in place, as outputs that a reader
without a kernel sees too (`workbench.lab.stored`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import torch
from IPython.display import display

from workbench.lab.stored import figure_bundle, html_bundle, table_bundle

RENDERER = "plotly_mimetype"
TEMPLATE = "plotly_white"
MiB = 2**20
GiB = 2**30


def setup_notebook() -> None:
    """Pin the plotly renderer and template (idempotent). Call once at the top of every notebook."""
    os.environ["PLOTLY_RENDERER"] = RENDERER
    pio.renderers.default = RENDERER
    pio.templates.default = TEMPLATE


def notebook_device() -> torch.device:
    """CUDA when present, else the CPU: what every notebook measures on."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_label(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"CUDA {torch.cuda.get_device_name(device)}"
    return f"CPU ({torch.get_num_threads()} threads)"


def device_memory_bytes(device: torch.device | str) -> int:
    """Memory of the device: a GPU's total memory, or the machine's RAM for the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# The real model's weights are dequantized Q4_1 (see README): every label that names it says so.
REAL_MODEL_LABEL = "SmolLM2-135M-Instruct (dequantized Q4_1)"


def model_label(model) -> str:
    name = model.spec.name
    return REAL_MODEL_LABEL if name.startswith("smollm2-135m") else f"{name} (random weights)"


def measured_on(model) -> str:
    """'<model> · <dtype> · <device>': the subtitle of every figure measured on a model."""
    return f"measured on {device_label(model.device)} · {dtype_name(model.dtype)} · {model_label(model)}"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


def style(fig: go.Figure, title: str, subtitle: str, *, height: int = 420) -> go.Figure:
    """Title with a subtitle naming what it was measured on; shared margins and legend placement."""
    fig.update_layout(title={"text": title, "subtitle": {"text": subtitle}}, template=TEMPLATE, height=height,
                      margin={"l": 70, "r": 30, "t": 90, "b": 60},
                      legend={"orientation": "h", "yanchor": "bottom", "y": -0.35, "x": 0})
    return fig


class Progress:
    """A progress bar and a line of text; measurements call it as ``progress(done, total, text)``."""

    def __init__(self) -> None:
        self.bar = widgets.IntProgress(value=0, min=0, max=1, layout={"width": "240px"})
        self.label = widgets.Label("")
        self.widget = widgets.HBox([self.bar, self.label])

    def __call__(self, done: int, total: int, text: str = "") -> None:
        self.bar.max = max(total, 1)
        self.bar.value = min(done, self.bar.max)
        self.label.value = text

    def finish(self, text: str) -> None:
        self.bar.value = self.bar.max
        self.label.value = text


ProgressFn = Callable[[int, int, str], None]


class StatusLine:
    """A panel's one-line reading of its result (HTML), published as a stored output beside its figures."""

    def __init__(self, value: str = "") -> None:
        self.value = value


class LabPanel:
    """Controls and a progress line (a live widget), then the panel's status line, figures and tables as stored
    outputs; ``refresh()`` re-measures, redraws and republishes them.

    Subclasses implement ``measure()`` (runs the engine, stores results) and ``draw()`` (updates ``figures``, plain
    ``go.Figure`` objects, in place, and sets ``status.value``); ``stored_tables()`` may add tables. Every control
    in ``controls`` re-runs both when its value changes; ``redraw_only`` controls only redraw (they change how
    results are shown, not what is measured). ``rows`` are extra widgets placed under the controls.

    Why figures are display outputs and not widgets: a widget view shows nothing without a live kernel, so the
    stored notebook and the docs site would have no figures (see `workbench.lab.stored`). Each output carries a
    display id: a control changed in the browser updates the panel's own outputs in place, while a later cell
    that changes a control from code gets its own copy of the new state, so every stored cell keeps showing the
    figure its prose talks about.
    """

    def __init__(self, controls: list[widgets.Widget], figures: list[go.Figure] | tuple[go.Figure, ...] = (), *,
                 rows: list[widgets.Widget] | None = None, redraw_only: list[widgets.Widget] | None = None):
        self.controls = controls
        self.figures = list(figures)
        self.redraw_only = redraw_only or []
        self._holding = False
        self._handles: list = []
        self._shown_in: str | None = None
        self.progress = Progress()
        self.status = StatusLine()
        for control in controls:
            control.observe(lambda _change: self._changed(self.refresh), names="value")
        for control in self.redraw_only:
            control.observe(lambda _change: self._changed(self.redraw), names="value")
        header: list[widgets.Widget] = [widgets.HBox(controls + self.redraw_only, layout={"flex_flow": "row wrap"}),
                                        self.progress.widget]
        self.widget = widgets.VBox(header + (rows or []))

    def measure(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def draw(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        """(caption, frame) pairs stored under the figures; the same number every time for a given panel."""
        return []

    def _changed(self, action: Callable[[], None]) -> None:
        if not self._holding:
            action()

    @contextmanager
    def changes(self) -> Iterator[None]:
        """Set several controls from code, then re-measure once: ``with panel.changes(): a.value = 1; b.value = 2``."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        self.refresh()

    def refresh(self) -> None:
        with self.busy():
            self.measure()
        self.redraw()

    def redraw(self) -> None:
        self.draw()
        self.publish()

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Disable the controls while measuring, so a second change cannot queue behind a running one."""
        for control in self.controls + self.redraw_only:
            control.disabled = True
        try:
            yield
        finally:
            for control in self.controls + self.redraw_only:
                control.disabled = False

    # ---- stored outputs ------------------------------------------------------------------------------------
    def stored_outputs(self, *, png: bool = True) -> list[dict[str, object]]:
        """MIME bundles of what the panel shows: its status line, each figure, each table."""
        bundles = [html_bundle(self.status.value or "&nbsp;")]
        bundles += [figure_bundle(fig, png=png) for fig in self.figures]
        bundles += [table_bundle(frame, caption) for caption, frame in self.stored_tables()]
        return bundles

    def _ipython_display_(self) -> None:
        display(self.widget)
        self._show_outputs()
        self._shown_in = _current_execution()

    def _show_outputs(self) -> None:
        self._handles = [display(bundle, raw=True, display_id=True) for bundle in self.stored_outputs()]

    def publish(self) -> None:
        """Bring the stored outputs up to date (nothing to do until the panel has been displayed)."""
        if not self._handles:
            return
        execution = _current_execution()
        if execution is not None and execution != self._shown_in:
            # A later cell changed the panel from code: show the new state there, leave the earlier cell as it was.
            for bundle in self.stored_outputs():
                display(bundle, raw=True)
            return
        for handle, bundle in zip(self._handles, self.stored_outputs(), strict=True):
            handle.update(bundle, raw=True)


def _current_execution() -> str | None:
    """The message id of the cell execution running now, or None outside one (a widget callback, plain Python)."""
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return None
    parent = kernel.get_parent() if hasattr(kernel, "get_parent") else {}
    header = (parent or {}).get("header", {})
    return header.get("msg_id") if header.get("msg_type") == "execute_request" else None
