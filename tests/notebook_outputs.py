"""What a stored chapter notebook must carry for readers without a kernel, read from the .ipynb JSON.

Shared by the refresh script (which refuses to write a notebook that fails) and the tests (which fail on a
committed one that does): every panel's widget view is followed by its stored figures, and every stored figure
has all three copies (plotly JSON for JupyterLab, HTML for the docs site, PNG for everything else).
"""

from __future__ import annotations

PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
FIGURE_COPIES = (PLOTLY, "text/html", "image/png")


def output_kinds(nb) -> list[list[set[str]]]:
    """For each code cell, the MIME types of each of its outputs."""
    return [[set(out.get("data", {})) for out in cell.get("outputs", [])]
            for cell in nb["cells"] if cell["cell_type"] == "code"]


def count_figures(nb) -> int:
    return sum(PLOTLY in kinds for cell in output_kinds(nb) for kinds in cell)


def check_stored_figures(nb) -> list[str]:
    """Problems that would leave a reader without a figure; empty when the notebook is fine."""
    problems = []
    for index, cell in enumerate(output_kinds(nb)):
        for kinds in cell:
            if PLOTLY in kinds and not set(FIGURE_COPIES) <= kinds:
                problems.append(f"code cell {index}: a figure lacks {sorted(set(FIGURE_COPIES) - kinds)}")
        widgets = sum(WIDGET in kinds for kinds in cell)
        figures = sum(PLOTLY in kinds for kinds in cell)
        if widgets and not figures:
            problems.append(f"code cell {index}: a widget panel with no stored figure")
    return problems
