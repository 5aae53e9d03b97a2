"""The committed chapter notebooks carry their figures for readers without a kernel: at least one stored figure
per panel, each with plotly JSON, HTML and PNG copies, and each notebook under 1 MB."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from notebook_outputs import WIDGET, check_stored_figures, count_figures, output_kinds

from workbench.lab.kit.baseline import coverage, disagreements

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


def evidence_cells(table_html: str) -> list[str]:
    """The evidence column's cells of a stored closing table (the third of four columns)."""
    rows = table_html.split("<tr>")[2:]
    return [row.split("<td")[3] if row.count("<td") >= 4 else "" for row in rows]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_closing_table_row_carries_its_evidence(path):
    """n, the effect against the claim's null, and the margin (or 'exact') in every row."""
    (table,) = closing_tables(nbformat.read(path, as_version=4))
    assert "evidence (n, effect, margin)" in table, f"{path.name}'s closing table has no evidence column"
    for i, cell in enumerate(evidence_cells(table), 1):
        assert "effect" in cell or "n = 0" in cell, f"{path.name} row {i}: no effect in {cell[:200]!r}"
        assert "margin ±" in cell or "exact" in cell or "n = 0" in cell, f"{path.name} row {i}: no margin"


OBJECT_REPR = re.compile(r"^<[\w.]+ (object|at 0x[0-9a-f]+)[^>]*>$|^(VBox|HBox)\(children=")


def object_reprs(nb) -> list[str]:
    """Outputs whose only text is an object's repr (a Markdown display, a pandas Styler, a widget box)."""
    found = []
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            text = "".join(out.get("data", {}).get("text/plain", "")).strip()
            if OBJECT_REPR.search(text):
                found.append(f"cell {index}: {text[:80]}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_stored_output_is_an_object_repr(path):
    assert object_reprs(nbformat.read(path, as_version=4)) == []


def test_the_repr_check_catches_markdown_and_styler_reprs():
    nb = nbformat.v4.new_notebook()
    reprs = ["<IPython.core.display.Markdown object>", "<pandas.io.formats.style.Styler at 0x7f2c27093350>"]
    nb.cells = [nbformat.v4.new_code_cell(outputs=[nbformat.v4.new_output(
        "display_data", data={"text/plain": text, "text/markdown": "x"})]) for text in reprs + ["a <b> sentence"]]
    assert len(object_reprs(nb)) == 2


def test_the_closing_table_check_catches_a_cut_table():
    from workbench.lab.kit.closing import ClosingTable, Takeaway, Verdict
    from workbench.lab.kit.evidence import Evidence

    table = ClosingTable([Takeaway("claim", "measured…", Verdict.HOLDS, evidence=(Evidence.exact("x", 2, 1),))])
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(outputs=[nbformat.v4.new_output(
        "execute_result", data={"text/html": table._repr_html_()}, execution_count=1)])]
    assert len(closing_tables(nb)) == 1 and "…" in closing_tables(nb)[0]


def recorded_baselines() -> list[dict]:
    found = []
    for path in NOTEBOOKS:
        meta = nbformat.read(path, as_version=4).metadata.get("workbench", {})
        found += [{**b, "notebook": path.stem, "machine_run": meta.get("machine")} for b in meta.get("baselines", [])]
    return found


# Chapters that time the model in a way the registry's figures describe, and must record them. ch05 times only
# mixed load runs (its TPOT is no decode step, and it says so where it shows it); ch09's replicas run one thread
# each behind a router (not comparable by design, as it says); ch10 times batch 4 in its batch-invariant mode.
RECORDING = {"ch01", "ch02", "ch03", "ch04", "ch06", "ch07", "ch08"}


def test_the_chapters_agree_on_the_baseline_costs():
    """Each chapter that times the model records the figures it measured (kit Baseline, lifted into the notebook
    metadata by refresh_outputs.py); measured in one sitting on one machine, they agree within 25% or the figure
    carries its explanation."""
    baselines = recorded_baselines()
    chapters = {b["chapter"] for b in baselines}
    assert chapters >= RECORDING, f"not recorded: {sorted(RECORDING - chapters)}"
    machines = {b["machine_run"] for b in baselines}
    assert len(machines) == 1, f"refresh the chapters in one sitting on one machine: {machines}"
    assert all(len(who) >= 2 for who in coverage(baselines).values()), coverage(baselines)
    assert disagreements(baselines) == []


def test_the_baseline_check_catches_a_2x_disagreement_unless_explained():
    def one(chapter, decode, prefill, tokens, **more):
        return {"chapter": chapter, "dtype": "float32", "source": "s", "decode_step_ms": decode,
                "prefill_ms_per_token": prefill, "prefill_tokens": tokens, **more}

    assert disagreements([one("ch01", 40.0, 2.0, 1024), one("ch04", 45.0, 2.2, 768)]) == []
    assert len(disagreements([one("ch01", 40.0, 2.0, 1024), one("ch08", 44.0, 3.5, 1024)])) == 1
    assert disagreements([one("ch01", None, 2.0, 1024), one("ch08", None, 6.0, 64)]) == []  # lengths too far apart
    explained = one("ch09", 80.0, None, None, explanations={"decode_step_ms": "one thread per replica"})
    assert disagreements([one("ch01", 40.0, 2.0, 1024), explained]) == []
    b16 = [one("ch04", 40.0, None, None, decode_step_b16_ms=48.0), one("ch08", 40.0, None, None,
                                                                          decode_step_b16_ms=82.0)]
    assert len(disagreements(b16)) == 1 and "decode_step_b16_ms" in disagreements(b16)[0]
