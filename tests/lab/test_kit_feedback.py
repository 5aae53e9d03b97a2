"""What a learner sees while a panel works (`workbench.lab.kit.progress`, `workbench.lab.kit.panel`): the progress
line lights within a second of the panel starting, its clock ticks while a silent measurement runs, the controls
are shown before the first measurement, a re-run dims the old numbers and figures, and the bar always ends filled
(green when done, red when stopped), never grey and empty."""

from __future__ import annotations

import threading
import time

import ipywidgets as widgets
import plotly.graph_objects as go
import pytest

import workbench.lab.kit.panel as panel_module
from workbench.lab.kit.panel import PROGRESS_NOTE, RERUN_NOTE, LabPanel
from workbench.lab.kit.progress import TICK_S


class SilentPanel(LabPanel):
    """A measurement that reports no progress of its own for ``seconds`` (holding the interpreter, as the
    engine's Python loop does), like chapter 2's first step on a busy machine."""

    def __init__(self, seconds: float = 2.5, *, fail: bool = False):
        self.seconds, self.fail = seconds, fail
        self.size = widgets.IntSlider(value=1, min=1, max=3)
        self.figure = go.Figure(go.Scatter(name="measured", x=[1, 2], y=[3, 4]))
        self.events: list[tuple[float, str, str]] = []  # (seconds since the refresh began, label, bar style)
        self.began: float | None = None
        super().__init__([self.size], [self.figure])
        for trait in ("value",):
            self.progress.label.observe(self._record, names=trait)

    def _record(self, _change) -> None:
        if self.began is not None:
            self.events.append((time.monotonic() - self.began, self.progress.label.value,
                                self.progress.bar.bar_style))

    def refresh(self) -> None:
        self.began = time.monotonic()
        super().refresh()

    def measure(self) -> int:
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            sum(range(2000))  # pure Python: the clock thread must still get its turns
        if self.fail:
            raise RuntimeError("the engine ran out of KV blocks")
        return self.size.value

    def draw(self) -> None:
        self.status.value = f"measured <b>{self.result}</b>"


def test_the_progress_line_lights_at_once_and_its_clock_ticks_while_the_work_is_silent():
    panel = SilentPanel(seconds=2.5)
    panel.run()
    first_time, first_label, first_style = panel.events[0]
    assert first_time < 1.0 and first_label.startswith("measuring") and first_style == "info"
    during = [label for t, label, _ in panel.events if 0 < t < panel.seconds]
    assert any(label.endswith("1 s") for label in during), during  # the clock, with no progress call at all
    assert any(label.endswith("2 s") for label in during), during
    assert panel.progress.bar.bar_style == "success" and panel.progress.bar.value == panel.progress.bar.max
    assert panel.progress.label.value.startswith("done · ") and panel.progress.label.value.endswith(" s")
    assert not panel.progress.running and TICK_S <= 1.0


def test_a_measurement_s_own_last_word_is_kept_with_the_time():
    class Finishing(SilentPanel):
        def measure(self) -> int:
            self.progress(1, 2, "first half")
            self.progress.finish("2 halves timed")
            return 2

    panel = Finishing().run()
    assert panel.progress.label.value.startswith("2 halves timed · ")
    assert panel.progress.bar.bar_style == "success"


def test_a_failed_measurement_turns_the_bar_red_and_says_why():
    panel = SilentPanel(seconds=0.1, fail=True)
    with pytest.raises(RuntimeError, match="KV blocks"):
        panel.run()
    assert panel.progress.bar.bar_style == "danger"
    assert "ran out of KV blocks" in panel.progress.label.value and not panel.progress.running
    assert not panel.size.disabled


def test_the_controls_and_progress_are_shown_before_the_first_measurement(monkeypatch):
    shown: list[str] = []
    panel = SilentPanel(seconds=0.1)
    original = panel.measure
    monkeypatch.setattr(panel, "measure", lambda: (shown.append("measure"), original())[1])
    monkeypatch.setattr(panel_module, "display",
                        lambda bundle, **_: shown.append("controls" if "application/vnd.jupyter.widget-view+json"
                                                         in bundle else "output"))
    panel._ipython_display_()
    assert shown[:2] == ["controls", "measure"] and shown[2:] == ["output", "output"]


class RecordingHandle:
    def __init__(self) -> None:
        self.updates: list[dict] = []

    def update(self, bundle, raw=False) -> None:
        self.updates.append(bundle)


def test_a_rerun_dims_the_old_numbers_and_figures_until_the_new_ones_arrive():
    panel = SilentPanel(seconds=0.1).run()
    handles = [RecordingHandle(), RecordingHandle()]
    panel._handles, panel._shown_in = handles, None  # displayed; a control changed in the browser (no cell)
    seen_during: list[dict] = []
    original = panel.measure

    def measure():
        seen_during.extend(h.updates[-1] for h in handles)  # what is on screen while it measures
        return original()

    panel.measure = measure
    panel.size.value = 2
    status, figure = seen_during
    assert RERUN_NOTE in status["text/html"] and "opacity:0.4" in status["text/html"]
    assert "measured <b>1</b>" in status["text/html"]  # the old number, dimmed, not gone
    veil = figure["application/vnd.plotly.v1+json"]["layout"]["shapes"][0]
    assert veil["fillcolor"] == "white" and veil["opacity"] == 0.6 and "image/png" not in figure
    final_status = handles[0].updates[-1]["text/html"]
    assert "measured <b>2</b>" in final_status and RERUN_NOTE not in final_status
    assert "shapes" not in handles[1].updates[-1]["application/vnd.plotly.v1+json"]["layout"]


def test_a_later_cell_rerunning_a_panel_leaves_the_earlier_outputs_undimmed(monkeypatch):
    panel = SilentPanel(seconds=0.1).run()
    handles = [RecordingHandle(), RecordingHandle()]
    panel._handles, panel._shown_in = handles, "the cell that showed it"
    monkeypatch.setattr(panel_module, "current_execution", lambda: "a later cell")
    monkeypatch.setattr(panel_module, "display", lambda *a, **k: None)
    panel.size.value = 3
    assert handles[0].updates == [] and handles[1].updates == []


def test_the_clock_thread_stops_with_the_panel():
    before = {t.name for t in threading.enumerate()}
    SilentPanel(seconds=1.2).run()
    assert "progress-clock" not in {t.name for t in threading.enumerate()} - before


def test_a_subtitle_names_the_threads_the_measurement_ran_on(monkeypatch):
    import torch

    from workbench.lab.kit.figures import style
    from workbench.lab.kit.panel import relabel_threads

    fig = style(go.Figure(), "Each new token", "measured on CPU (2 threads) · float32 · SmolLM2-135M-Instruct")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        relabel_threads(fig)
        assert fig.layout.title.subtitle.text == "measured on CPU (1 thread) · float32 · SmolLM2-135M-Instruct"
    finally:
        torch.set_num_threads(threads)


def test_a_later_cell_rerunning_a_panel_shows_the_progress_line_where_the_learner_is(monkeypatch):
    shown: list = []
    panel = SilentPanel(seconds=0.1).run()
    panel._handles, panel._shown_in = [RecordingHandle(), RecordingHandle()], "the cell that showed it"
    monkeypatch.setattr(panel_module, "current_execution", lambda: "a later cell")
    monkeypatch.setattr(panel_module, "display", lambda obj, **_: shown.append(obj))
    panel.size.value = 3
    # first, before the measurement's new outputs; stored with a sentence, not the widget's repr
    view = shown[0]["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == panel.progress.widget.model_id and shown[0]["text/plain"] == PROGRESS_NOTE
