"""What notebooks/refresh_outputs.py writes besides outputs, so that a stored notebook reads well:

- the installed kernel's ``kernelspec``: JupyterLab rewrites it when it starts the kernel, and the stored "Python 3"
  (the kernel says "Python 3 (ipykernel)") made every chapter open marked unsaved (closing asked to save; saving
  rewrote the stored file);
- nbval's check markers as cell tags, not as ``# NBVAL_CHECK_OUTPUT`` comments in the code a learner reads.

The checks of the stored notebooks are strict xfails until the next refresh: then they pass, and the markers go.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "notebooks"))
from refresh_outputs import CHECK_MARKER, CHECK_TAG, KERNEL, kernelspec_metadata, tag_checked_cells  # noqa: E402

CHAPTERS = sorted((ROOT / "notebooks").glob("ch[0-9][0-9]_*.ipynb"))


def test_the_refresh_writes_the_installed_kernel_s_spec():
    spec = KernelSpecManager().get_kernel_spec(KERNEL)
    assert kernelspec_metadata() == {"display_name": spec.display_name, "language": spec.language, "name": KERNEL}


# Strict: once the notebooks are refreshed with the fixed script (issue 41's refresh) this passes, and the marker
# must go (an unexpected pass fails).
@pytest.mark.xfail(strict=True, reason="the stored notebooks carry the old kernelspec until the next refresh")
def test_every_stored_notebook_opens_unchanged_in_jupyterlab():
    expected = kernelspec_metadata()
    stale = [path.name for path in CHAPTERS if nbformat.read(path, as_version=4).metadata.get("kernelspec") != expected]
    assert not stale, f"kernelspec differs from the installed kernel's ({expected}): {stale}"


def test_check_markers_become_tags_and_leave_the_code():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(f"# 2.1 Bytes per token\n{CHECK_MARKER}\nprint(46_080)"),
        nbformat.v4.new_code_cell("print('timed: not checked')"),
        nbformat.v4.new_markdown_cell(f"Cells marked {CHECK_MARKER} are compared."),
    ])
    assert tag_checked_cells(nb) == 1 and tag_checked_cells(nb) == 0
    checked, timed, prose = nb.cells
    assert checked.source == "# 2.1 Bytes per token\nprint(46_080)" and checked.metadata["tags"] == [CHECK_TAG]
    assert "tags" not in timed.metadata and CHECK_MARKER in prose.source


@pytest.mark.xfail(strict=True, reason="the stored notebooks carry the comment markers until the next refresh")
def test_no_learner_facing_cell_carries_an_nbval_marker():
    marked = [f"{path.name} cell {i}" for path in CHAPTERS
              for i, cell in enumerate(nbformat.read(path, as_version=4).cells)
              if cell.cell_type == "code" and CHECK_MARKER in cell.source]
    assert not marked, f"{len(marked)} cells show {CHECK_MARKER} to the learner: {marked[:5]}"
