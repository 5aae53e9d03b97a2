"""Stored outputs: every panel publishes its status, figures (plotly JSON + HTML + PNG) and tables, and the
'Try this' checks say right or wrong. Rendering a PNG needs Chromium (installed by .ci/run)."""

from __future__ import annotations

import base64
import io
import shutil
import threading
import time

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
import pytest
from PIL import Image

from workbench.lab.kit.exercises import Exercise
from workbench.lab.kit.figures import set_trace
from workbench.lab.kit.panel import LabPanel
from workbench.lab.kit.stored import PLOTLY_MIME, PngExport, figure_bundle, html_bundle, table_bundle


class SquaresPanel(LabPanel):
    """A panel over a tiny computation: y = x² for x up to a slider value."""

    def __init__(self):
        self.n = widgets.IntSlider(value=3, min=1, max=10)
        self.fig = go.Figure(go.Scatter(mode="lines", name="squares"))
        self.fig.update_layout(title="squares", height=300)
        super().__init__([self.n], [self.fig])

    def measure(self):
        self.xs = list(range(self.n.value + 1))
        return self.xs

    def draw(self):
        with self.fig.batch_update():
            set_trace(self.fig, "squares", x=self.xs, y=[x * x for x in self.xs])
        self.status.value = f"largest square <b>{self.xs[-1] ** 2}</b>"

    def stored_tables(self):
        return [("the squares", pd.DataFrame({"x": self.xs, "x²": [x * x for x in self.xs]}))]


def test_panel_stores_status_figure_and_table():
    panel = SquaresPanel().run()
    status, figure, table = panel.stored_outputs(png=False)
    assert status["text/plain"] == "largest square 9" and "<b>9</b>" in status["text/html"]
    assert [t["y"] for t in figure[PLOTLY_MIME]["data"] if t["name"] == "squares"] == [[0, 1, 4, 9]]
    assert "Plotly.newPlot" in figure["text/html"] and "<script" in figure["text/html"]
    assert "image/png" not in figure and figure["text/plain"] == "<figure: squares>"
    assert "the squares" in table["text/html"] and "81" not in table["text/plain"]
    panel.n.value = 9  # a control re-measures and redraws
    assert panel.stored_outputs(png=False)[2]["text/plain"].splitlines()[-1].split() == ["9", "9", "81"]


@pytest.mark.skipif(shutil.which("chromium") is None, reason="plotly's PNG export needs Chromium (.ci/run installs it)")
def test_figure_bundle_carries_a_real_png():
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1, 2]))
    fig.update_layout(height=300)
    png = base64.b64decode(figure_bundle(fig)["image/png"])
    assert png.startswith(b"\x89PNG")
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.size == (1000, 300)  # plotly's default width, the figure's height
    # The bars were drawn: plotly's first colour (#636efa) covers a good share of the picture, not a blank page.
    pixels = image.get_flattened_data() if hasattr(image, "get_flattened_data") else image.getdata()  # Pillow 12+
    bar_pixels = sum(1 for r, g, b in pixels if abs(r - 0x63) < 8 and abs(g - 0x6E) < 8 and b > 0xF0)
    assert bar_pixels > 0.1 * image.size[0] * image.size[1]


def test_bundles_of_tables_and_status_lines():
    frame = pd.DataFrame({"tokens": [1, 2], "share": [0.1234567, 0.5]})
    bundle = table_bundle(frame, "caption")
    assert bundle["text/plain"].startswith("caption\n") and "0.123" in bundle["text/plain"]
    assert html_bundle("a <b>b</b> &amp; c")["text/plain"] == "a b & c"


def test_exercise_checks_numbers_strings_and_unanswered():
    kv = Exercise("bytes per token?", lambda: 2 * 80 * 8 * 128 * 2, why="2 x layers x kv heads x dim x bytes",
                  rel_tol=0.0, hint="count K and V")
    assert kv.check(327_680).correct is True and "327,680" in str(kv.check(327_680))
    wrong = kv.check(1_310_720)
    assert wrong.correct is False and "1,310,720" in wrong.message and "327,680" in wrong.message
    todo = kv.check(...)
    assert todo.correct is None and "count K and V" in todo.message and not todo
    assert "✔" in kv.check(327_680)._repr_html_()
    variant = Exercise("variant?", lambda: "GQA", why="8 KV heads for 64 query heads")
    assert variant.check(" gqa ").correct and not variant.check("MHA").correct
    close = Exercise("ratio?", lambda: 1.675, why="3.35 / 2.0", rel_tol=0.01)
    assert close.check(1.68).correct and not close.check(2.0).correct
    with pytest.raises(ValueError, match="function"):
        Exercise("q", 3, why="")


def test_png_export_without_a_browser_says_so_at_once(monkeypatch, capsys):
    # kaleido's own server would wait forever here: its thread dies on the missing browser.
    monkeypatch.setenv("BROWSER_PATH", "/nonexistent/chromium")
    monkeypatch.delenv("WORKBENCH_REQUIRE_PNG", raising=False)
    export, start = PngExport(), time.perf_counter()
    assert export(go.Figure(go.Scatter(y=[1, 2]))) is None
    assert time.perf_counter() - start < 5 and "BROWSER_PATH='/nonexistent/chromium'" in export.skipped_because
    assert "PNG copies of figures are skipped" in capsys.readouterr().out
    assert export(go.Figure()) is None  # said once, then quiet
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("WORKBENCH_REQUIRE_PNG", "1")  # refresh_outputs.py: a stored notebook needs its PNGs
    with pytest.raises(RuntimeError, match="install Chromium"):
        PngExport()(go.Figure())


def test_png_export_gives_up_on_a_server_that_never_answers(monkeypatch):
    monkeypatch.delenv("WORKBENCH_REQUIRE_PNG", raising=False)
    never = threading.Event()
    export = PngExport()
    export.FIRST_IMAGE_TIMEOUT_S = 0.5
    monkeypatch.setattr(export, "_start", lambda: None)
    monkeypatch.setattr(export, "_render", lambda fig: never.wait())
    start = time.perf_counter()
    assert export(go.Figure()) is None
    assert time.perf_counter() - start < 5 and export.skipped_because.startswith("TimeoutError")
    never.set()
