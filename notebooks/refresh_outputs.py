"""Re-execute the chapter notebooks in place so that their committed outputs are fresh, check that every figure
was stored whole, and report how long each took top to bottom (the budget is 120 s per notebook on a 2-core CPU).

Widget state is not stored: it would embed every figure's data and plotly's JavaScript (megabytes per
notebook). What a reader without a kernel sees comes from the panels' stored outputs instead
(`workbench.lab.kit.stored`): each figure as plotly JSON, HTML and PNG. ``WORKBENCH_REQUIRE_PNG=1`` is set for the
kernel, so a missing browser fails the refresh instead of storing a figure without its PNG.

    .venv/bin/python notebooks/refresh_outputs.py [ch02_kv_cache.ipynb ...]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from notebook_outputs import check_stored_figures  # noqa: E402

SIZE_LIMIT = 1 << 20
SLOW_CELL_S = 3.0  # cells at least this slow are listed with their time
KERNEL = "python3"


def record_run(nb, elapsed: float) -> None:
    """The notebook's metadata says when, on what and how fast it ran, and which baseline costs it measured
    (lifted from its outputs: `workbench.lab.kit.baseline`), so the chapters can be checked against each other."""
    from workbench.lab.kit.baseline import stored_baselines
    from workbench.timing import describe_machine

    nb.metadata["workbench"] = {"executed": time.strftime("%Y-%m-%d"), "machine": describe_machine("cpu"),
                                "seconds": round(elapsed, 1), "baselines": stored_baselines(nb)}


def kernelspec_metadata(name: str = KERNEL) -> dict[str, str]:
    """The notebook's ``kernelspec`` exactly as JupyterLab writes it for the installed kernel. Any other value
    (nbclient keeps whatever the file had, "Python 3") is rewritten by JupyterLab when the kernel starts, and the
    notebook opens marked unsaved: closing it asks to save, and saving rewrites the stored notebook."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(name)
    return {"display_name": spec.display_name, "language": spec.language, "name": name}


CHECK_MARKER = "# NBVAL_CHECK_OUTPUT"
CHECK_TAG = "nbval-check-output"  # nbval reads a cell's tags as it reads its marker comments


def tag_checked_cells(nb) -> int:
    """Move nbval's ``# NBVAL_CHECK_OUTPUT`` comment out of the code a learner reads into the cell's tags, where
    nbval finds it the same way; returns how many cells moved."""
    moved = 0
    for cell in nb.cells:
        lines = cell.source.splitlines()
        if cell.cell_type != "code" or not any(line.strip() == CHECK_MARKER for line in lines):
            continue
        cell.source = "\n".join(line for line in lines if line.strip() != CHECK_MARKER)
        tags = cell.metadata.setdefault("tags", [])
        if CHECK_TAG not in tags:
            tags.append(CHECK_TAG)
        moved += 1
    return moved


def busy_outputs(nb) -> int:
    """How many stored outputs say the machine was busy while they were measured (`workbench.lab.kit.contention`):
    a refresh on a shared machine stores timings that are the neighbours' as much as the engine's."""
    from workbench.lab.kit.contention import BUSY

    return sum(BUSY in str(output.get("data", {}).get("text/plain", "")) for cell in nb.cells
               for output in cell.get("outputs", []))


def cell_seconds(nb) -> list[tuple[str, float]]:
    """Each code cell's first line and its run time, from nbclient's timing metadata, which this removes again (it
    would change on every refresh): the refresh prints the slow ones so that a cell's promised time can be checked."""
    from datetime import datetime

    times = []
    for cell in nb.cells:
        timing = cell.get("metadata", {}).pop("execution", None)
        if cell.cell_type != "code" or not timing:
            continue
        start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        if start and end:
            seconds = (datetime.fromisoformat(end.replace("Z", "+00:00"))
                       - datetime.fromisoformat(start.replace("Z", "+00:00"))).total_seconds()
            times.append((cell.source.splitlines()[0] if cell.source else "", seconds))
    return times


def refresh(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    tag_checked_cells(nb)
    os.environ["WORKBENCH_REQUIRE_PNG"] = "1"  # inherited by the kernel
    client = NotebookClient(nb, timeout=600, kernel_name=KERNEL, record_timing=True, store_widget_state=False,
                            resources={"metadata": {"path": str(HERE)}})
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    nb.metadata.pop("widgets", None)
    for first_line, seconds in cell_seconds(nb):
        if seconds >= SLOW_CELL_S:
            print(f"  {seconds:5.1f} s  {first_line[:100]}", file=sys.stderr)
    nb.metadata["kernelspec"] = kernelspec_metadata()
    record_run(nb, elapsed)
    busy = busy_outputs(nb)
    if busy:
        print(f"{path.name}: {busy} outputs say the machine was busy while they were measured; refresh on a quiet "
              "machine (tests/test_notebook_refresh.py checks it)", file=sys.stderr)
    problems = check_stored_figures(nb)
    if problems:
        raise SystemExit(f"{path.name}: " + "; ".join(problems))
    nbformat.write(nb, path)
    size = path.stat().st_size
    if size > SIZE_LIMIT:
        raise SystemExit(f"{path.name} is {size:,} bytes, over the {SIZE_LIMIT:,}-byte limit")
    return elapsed


def main(names: list[str]) -> None:
    paths = [HERE / n for n in names] if names else sorted(HERE.glob("ch*.ipynb"))
    for path in paths:
        elapsed = refresh(path)
        print(f"{path.name}: executed in {elapsed:.1f} s, {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
