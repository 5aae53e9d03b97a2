"""The committed chapter notebooks carry their figures for readers without a kernel: at least one stored figure
per panel, each with plotly JSON, HTML and PNG copies, and each notebook under 1 MB."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from notebook_outputs import WIDGET, check_stored_figures, count_figures, output_kinds

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("ch*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_panel_stores_its_figures(path):
    nb = nbformat.read(path, as_version=4)
    assert check_stored_figures(nb) == []
    panels = sum(WIDGET in kinds for cell in output_kinds(nb) for kinds in cell)
    assert panels >= 1 and count_figures(nb) >= panels, (panels, count_figures(nb))
    assert path.stat().st_size < 1 << 20


def test_the_check_catches_a_figure_without_png():
    nb = nbformat.v4.new_notebook()
    figure = nbformat.v4.new_output("display_data", data={"application/vnd.plotly.v1+json": {}, "text/html": ""})
    widget = nbformat.v4.new_output("display_data", data={WIDGET: {"model_id": "x"}})
    nb.cells = [nbformat.v4.new_code_cell(outputs=[figure]), nbformat.v4.new_code_cell(outputs=[widget])]
    problems = check_stored_figures(nb)
    assert "lacks ['image/png']" in problems[0] and "no stored figure" in problems[1]
