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

What a learner sees while a panel works: on first display the controls and the progress line come first, lit
within a second of the cell starting, with a running clock (`workbench.lab.kit.progress`); on a re-run the old
status line and figures are dimmed under a "re-measuring" note until the new ones replace them. Before each
measurement torch gets the threads the machine can spare now (`workbench.lab.kit.threads`), and the measurement
is watched for contention (`workbench.lab.kit.contention`): ``panel.contention`` says whether the machine was
busy, and a busy run's status line says so, for the prose and the closing table to read instead of concluding.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from IPython.display import display

from workbench.lab.kit.contention import Contention, watch
from workbench.lab.kit.notebook import device_label
from workbench.lab.kit.progress import Progress
from workbench.lab.kit.stored import figure_bundle, html_bundle, table_bundle
from workbench.lab.kit.threads import ThreadChoice, adapt_threads

LIVE_CONTROLS_NOTE = "[live controls: run this cell in JupyterLab to get them]"
RERUN_NOTE = "re-measuring with the new settings: the numbers and figures below are the previous run's"
# The text fallback of a progress line shown in a later cell that re-runs a panel: the widget's own is its repr.
PROGRESS_NOTE = "[a progress line: it counts the seconds of the re-run in JupyterLab]"
# The machine (fewer threads, a busy run) is reported in the status line only for measurements this long: a
# quick computation's timing is not what its panel shows.
BUSY_REPORT_MIN_S = 1.0
THREADS_LABEL = re.compile(r"CPU \(\d+ threads?\)")  # as workbench.lab.kit.notebook.device_label writes it


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
        self.contention: Contention | None = None  # the last measurement's, see workbench.lab.kit.contention
        self.threads: ThreadChoice | None = None  # torch's threads for the last measurement
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

    def same_work(self) -> list[tuple[str, float, float]]:
        """Timings of identical work inside the last measurement, as (what, seconds, seconds), e.g. the same
        prompt's prefill in both arms of a comparison: folded into ``contention``, whose busy signal fires when
        they disagree by more than `workbench.lab.kit.contention.AGREEMENT`. None by default."""
        return []

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
        rerun = self.measured
        self.progress.start("re-measuring" if rerun else "measuring")
        if rerun:
            self._dim()
            self._progress_here()
        try:
            with self.busy():
                self.threads = adapt_threads()
                for fig in self.figures:
                    relabel_threads(fig)
                with watch() as watched:
                    self._result = self.measure()
            self.contention = watched.contention
            self.measured = True
            for what, first_s, second_s in self.same_work():
                self.contention = self.contention.same_work(what, first_s, second_s)
            self.redraw()
        except BaseException as error:
            self.progress.fail(error)
            raise
        self.progress.end()

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
        bundles = [html_bundle((self.status.value or "&nbsp;") + self.machine_note())]
        bundles += [figure_bundle(fig, png=png) for fig in self.figures]
        bundles += [table_bundle(frame, caption) for caption, frame in self.stored_tables()]
        return bundles

    def machine_note(self) -> str:
        """What the status line adds about the machine: fewer torch threads than usual, and a busy machine."""
        if self.contention is None or self.contention.wall_s < BUSY_REPORT_MIN_S:
            return ""
        note = ""
        if self.threads is not None and self.threads.reduced:
            note += (f"<br><span style='color:#6b7280'>torch ran on {self.threads.threads} of "
                     f"{self.threads.ceiling} threads: {self.threads.reason}</span>")
        return note + self.contention.status_html()

    def _progress_here(self) -> None:
        """A later cell re-running the panel from code shows the progress line in that cell too: the panel's own
        line is in the cell that first showed it, off screen while the learner watches this one."""
        execution = current_execution()
        if self._handles and execution is not None and execution != self._shown_in:
            bundle = dict(self.progress.widget._repr_mimebundle_())
            bundle["text/plain"] = PROGRESS_NOTE  # stored for readers without a kernel: no "HBox(children=..."
            display(bundle, raw=True)

    def _dim(self) -> None:
        """Grey out the outputs on screen while a re-run measures (nothing when a later cell re-runs the panel
        from code: its outputs are that cell's own, and the earlier cell keeps what it showed)."""
        execution = current_execution()
        if not self._handles or (execution is not None and execution != self._shown_in):
            return
        status = html_bundle(f"<div style='color:#1d4ed8'>&#8635; {RERUN_NOTE}</div>"
                             f"<div style='opacity:0.4'>{self.status.value or '&nbsp;'}</div>")
        bundles = [status] + [figure_bundle(dimmed(fig), png=False) for fig in self.figures]
        for handle, bundle in zip(self._handles, bundles, strict=False):
            handle.update(bundle, raw=True)

    def _ipython_display_(self) -> None:
        # The controls and the progress line first, so the learner sees at once that the panel is working.
        display(self.controls_bundle(), raw=True)
        if not self.measured:
            self.run()
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


def relabel_threads(fig: go.Figure) -> None:
    """Make a figure's "measured on CPU (N threads)" subtitle name the threads torch has now."""
    title = fig.layout.title
    text = title.subtitle.text if title and title.subtitle else None
    if text and THREADS_LABEL.search(text):
        fig.layout.title.subtitle.text = THREADS_LABEL.sub(device_label("cpu"), text)


def dimmed(fig: go.Figure) -> go.Figure:
    """A copy of ``fig`` under a white veil, saying that it is being re-measured."""
    copy = go.Figure(fig)
    copy.add_shape(type="rect", xref="paper", yref="paper", x0=0, y0=0, x1=1, y1=1, fillcolor="white",
                   opacity=0.6, line_width=0, layer="above")
    copy.add_annotation(text="re-measuring…", xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                        font={"size": 18, "color": "#1d4ed8"})
    return copy


def current_execution() -> str | None:
    """The message id of the cell execution running now, or None outside one (a widget callback, plain Python)."""
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return None
    parent = kernel.get_parent() if hasattr(kernel, "get_parent") else {}
    header = (parent or {}).get("header", {})
    return header.get("msg_id") if header.get("msg_type") == "execute_request" else None
