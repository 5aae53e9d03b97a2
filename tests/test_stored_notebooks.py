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


TOLERANCE = 1.25  # the same figure may differ by at most 25% between chapters


def recorded_baselines() -> list[dict]:
    found = []
    for path in NOTEBOOKS:
        meta = nbformat.read(path, as_version=4).metadata.get("workbench", {})
        found += [{**b, "notebook": path.stem, "machine_run": meta.get("machine")} for b in meta.get("baselines", [])]
    return found


def disagreements(baselines: list[dict]) -> list[str]:
    """Pairs of chapters whose same figure (same dtype; prefill at prompt lengths within 2x) differs by more than
    the tolerance."""
    problems = []
    for i, a in enumerate(baselines):
        for b in baselines[i + 1:]:
            if a["dtype"] != b["dtype"] or a["chapter"] == b["chapter"]:
                continue
            pairs = [("decode_step_ms", a["decode_step_ms"], b["decode_step_ms"])]
            if a["prefill_tokens"] and b["prefill_tokens"] and \
                    max(a["prefill_tokens"], b["prefill_tokens"]) <= 2 * min(a["prefill_tokens"], b["prefill_tokens"]):
                pairs.append(("prefill_ms_per_token", a["prefill_ms_per_token"], b["prefill_ms_per_token"]))
            problems += [f"{name}: {a['chapter']} {x:.3g} ({a['source']}) vs {b['chapter']} {y:.3g} ({b['source']})"
                         for name, x, y in pairs if x and y and max(x, y) > TOLERANCE * min(x, y)]
    return problems


def test_the_chapters_agree_on_the_baseline_costs():
    """Each chapter records the batch-1 decode step and prefill cost it measured (kit Baseline, lifted into the
    notebook metadata by refresh_outputs.py); measured in one sitting on one machine, they must agree."""
    baselines = recorded_baselines()
    chapters = {b["chapter"] for b in baselines}
    assert len(chapters) >= 3, f"only {sorted(chapters)} record baselines"
    machines = {b["machine_run"] for b in baselines}
    assert len(machines) == 1, f"refresh the chapters in one sitting on one machine: {machines}"
    assert {b["chapter"] for b in baselines if b["decode_step_ms"]} and \
        {b["chapter"] for b in baselines if b["prefill_ms_per_token"]}
    assert disagreements(baselines) == []


def test_the_baseline_check_catches_a_2x_disagreement():
    def one(chapter, decode, prefill, tokens):
        return {"chapter": chapter, "dtype": "float32", "source": "s", "decode_step_ms": decode,
                "prefill_ms_per_token": prefill, "prefill_tokens": tokens}

    assert disagreements([one("ch01", 40.0, 2.0, 1024), one("ch04", 45.0, 2.2, 768)]) == []
    assert len(disagreements([one("ch01", 40.0, 2.0, 1024), one("ch08", 44.0, 3.5, 1024)])) == 1
    assert disagreements([one("ch01", None, 2.0, 1024), one("ch08", None, 6.0, 64)]) == []  # lengths too far apart
