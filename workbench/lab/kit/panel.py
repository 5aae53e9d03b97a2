"""The panel every chapter builds on: live controls and a progress line (a widget), then a status line, figures
and tables as stored outputs, and the result object the chapter's prose and closing table read.

A panel measures when asked, never when constructed: ``panel.run()`` measures and draws (and returns the
panel), and displaying a panel that has not run yet runs it first. So a notebook cell that shows a panel still
shows it measured, while tests and other code can build panels, change their controls with ``changes()`` and
run them once.

Why figures are display outputs and not widgets: a widget view shows nothing without a live kernel, so the
stored notebook and the docs site would have no figures (see `workbench.lab.kit.stored`). Each output carries
a display id: a control changed in the browser updates the panel's own outputs in place, while a later cell
that changes a control from code gets its own copy of the new state, so every stored cell keeps showing the
figure its prose talks about.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from IPython.display import display

from workbench.lab.kit.progress import Progress
from workbench.lab.kit.stored import figure_bundle, html_bundle, table_bundle

LIVE_CONTROLS_NOTE = "[live controls: run this notebook in JupyterLab to change them]"


class StatusLine:
    """A panel's one-line reading of its result (HTML), published as a stored output beside its figures."""

    def __init__(self, value: str = "") -> None:
        self.value = value


class LabPanel:
    """Subclasses implement ``measure()`` (runs the engine and returns the panel's result object, which the
    base keeps as ``result``) and ``draw()`` (updates ``figures``, plain ``go.Figure`` objects, in place, and sets
    ``status.value``); ``stored_tables()`` may add tables. Every control in ``controls`` re-measures when its value
    changes; ``redraw_only`` controls only redraw (they change how results are shown, not what is measured).
    ``rows`` are extra widgets placed under the controls.
    """

    def __init__(self, controls: list[widgets.Widget], figures: list[go.Figure] | tuple[go.Figure, ...] = (), *,
                 rows: list[widgets.Widget] | None = None, redraw_only: list[widgets.Widget] | None = None):
        self.controls = controls
        self.figures = list(figures)
        self.redraw_only = redraw_only or []
        self.measured = False
        self._result: Any = None
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

    def measure(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def draw(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def stored_tables(self) -> list[tuple[str, pd.DataFrame]]:
        """(caption, frame) pairs stored under the figures; the same number every time for a given panel."""
        return []

    @property
    def result(self) -> Any:
        """What the last measurement returned; the panel measures first if it never has."""
        if not self.measured:
            self.run()
        return self._result

    def run(self) -> LabPanel:
        """Measure with the controls as they are and draw; returns the panel (``panel = SomeLab(...).run()``)."""
        self.refresh()
        return self

    def _changed(self, action: Callable[[], None]) -> None:
        if not self._holding:
            action() if self.measured else self.refresh()

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
            self._result = self.measure()
        self.measured = True
        self.redraw()

    def redraw(self) -> None:
        if not self.measured:
            self.refresh()
            return
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
        if not self.measured:
            self.run()
        display(self.controls_bundle(), raw=True)
        self._show_outputs()
        self._shown_in = current_execution()

    def controls_bundle(self) -> dict[str, object]:
        """The controls as a widget view, whose text fallback (what a reader without a kernel sees: the docs site,
        a repository browser) says where the live controls are instead of printing the widget tree."""
        bundle = dict(self.widget._repr_mimebundle_())
        bundle["text/plain"] = LIVE_CONTROLS_NOTE
        return bundle

    def _show_outputs(self) -> None:
        self._handles = [display(bundle, raw=True, display_id=True) for bundle in self.stored_outputs()]

    def publish(self) -> None:
        """Bring the stored outputs up to date (nothing to do until the panel has been displayed)."""
        if not self._handles:
            return
        execution = current_execution()
        if execution is not None and execution != self._shown_in:
            # A later cell changed the panel from code: show the new state there, leave the earlier cell as it was.
            for bundle in self.stored_outputs():
                display(bundle, raw=True)
            return
        for handle, bundle in zip(self._handles, self.stored_outputs(), strict=True):
            handle.update(bundle, raw=True)


def current_execution() -> str | None:
    """The message id of the cell execution running now, or None outside one (a widget callback, plain Python)."""
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return None
    parent = kernel.get_parent() if hasattr(kernel, "get_parent") else {}
    header = (parent or {}).get("header", {})
    return header.get("msg_id") if header.get("msg_type") == "execute_request" else None
