"""The lab's two boundaries: nothing outside ``workbench.lab`` imports it (the engine, the kernels and the
benchmarks stay usable without a notebook stack), and a chapter's measurements (``runs``) and the kit's
widget-free modules import without loading ipywidgets or plotly."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p.name for p in (ROOT / "workbench" / "lab").glob("ch[0-9][0-9]") if p.is_dir())


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
    return found


def test_nothing_outside_the_lab_imports_it():
    lab = ROOT / "workbench" / "lab"
    offenders = []
    for folder in ("workbench", "kernels", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if lab in path.parents:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line} imports {name}" for line, name in _imports(path)
                          if name == "workbench.lab" or name.startswith("workbench.lab.")]
    assert not offenders, "\n".join(offenders)


def test_every_chapter_is_a_package_of_the_same_shape():
    notebooks = sorted(p.name[:4] for p in (ROOT / "notebooks").glob("ch[0-9][0-9]_*.ipynb"))
    assert notebooks == CHAPTERS and CHAPTERS[:8] == [f"ch{n:02d}" for n in range(1, 9)]
    for chapter in CHAPTERS:
        folder = ROOT / "workbench" / "lab" / chapter
        missing = [n for n in ("__init__.py", "runs.py", "panels.py", "ending.py") if not (folder / n).exists()]
        assert not missing, f"{chapter} lacks {missing}"


def test_no_lab_module_is_over_300_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "workbench" / "lab").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 300}
    assert not long, long


@pytest.mark.parametrize("module", ["workbench.lab.kit.closing", "workbench.lab.kit.exercises",
                                    "workbench.lab.kit.notebook", "workbench.lab.kit.lazy"]
                         + [f"workbench.lab.{c}.runs" for c in CHAPTERS])
def test_measurements_import_without_widgets_or_plotly(module):
    code = (f"import sys, {module}\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('ipywidgets', 'plotly'))\n"
            "print(loaded[:5]); sys.exit(1 if loaded else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"importing {module} loaded {done.stdout.strip()} {done.stderr[-2000:]}"


def test_no_trace_is_addressed_by_position():
    """Traces are read and set by name (``workbench.lab.kit.figures``); ``fig.data[3]`` breaks silently when a
    trace is added above it."""
    import re

    by_position = re.compile(r"\.data\[\s*-?\d+\s*\]")
    found = [f"{p.relative_to(ROOT)}:{n}" for folder in (ROOT / "workbench" / "lab", ROOT / "tests" / "lab")
             for p in folder.rglob("*.py") for n, line in enumerate(p.read_text().splitlines(), 1)
             if by_position.search(line)]
    assert not found, found
