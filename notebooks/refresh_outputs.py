"""Re-execute the chapter notebooks in place so that their committed outputs are fresh, and report how long
each took top to bottom (the budget is 120 s per notebook on a 2-core CPU).

Widget state is not stored: it would embed every figure's data and plotly's JavaScript (megabytes per
notebook), and a reader's JupyterLab rebuilds the widgets when the cells run anyway.

    .venv/bin/python notebooks/refresh_outputs.py [ch02_kv_cache.ipynb ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
SIZE_LIMIT = 1 << 20


def refresh(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False, store_widget_state=False,
                            resources={"metadata": {"path": str(HERE)}})
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    nb.metadata.pop("widgets", None)
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
