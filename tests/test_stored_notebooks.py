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


def closing_tables(nb) -> list[str]:
    """The HTML of every closing table a notebook stores (the kit's ClosingTable carries class closing-table)."""
    return [out["data"]["text/html"] for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
            if "closing-table" in str(out.get("data", {}).get("text/html", ""))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_chapter_stores_one_whole_closing_table(path):
    tables = closing_tables(nbformat.read(path, as_version=4))
    assert len(tables) == 1, f"{path.name} stores {len(tables)} closing tables (the kit's ClosingTable), not 1"
    assert "…" not in tables[0] and "..." not in tables[0], f"{path.name}'s closing table is cut short"
    verdicts = {"holds", "holds with a caveat", "wrong", "not measurable here"}
    cells = tables[0].split("<tr>")[2:]
    assert cells and all(any(f">{v}" in row for v in verdicts) for row in cells), "a row without a kit verdict"


def test_the_closing_table_check_catches_a_cut_table():
    from workbench.lab.kit.closing import ClosingTable, Takeaway, Verdict

    table = ClosingTable([Takeaway("claim", "measured…", Verdict.HOLDS)])
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(outputs=[nbformat.v4.new_output(
        "execute_result", data={"text/html": table._repr_html_()}, execution_count=1)])]
    assert len(closing_tables(nb)) == 1 and "…" in closing_tables(nb)[0]
