"""nbval settings for the chapter notebooks: the sanitize file is found next to this conftest, so the
notebooks can be tested from any working directory (`pytest notebooks/ch02_kv_cache.ipynb`)."""

from __future__ import annotations

import os
from pathlib import Path

from nbval.plugin import IPyNbCell

SANITIZE_FILE = Path(__file__).with_name("nbval_sanitize.cfg")

# Under pytest-xdist (`make test`), a notebook's kernel gets its worker's share of the cores, as in tests/conftest.py
# (which sets it first when the whole suite runs; this covers `pytest -n 2 notebooks/`).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _WORKERS > 1:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(max(1, len(os.sched_getaffinity(0)) // _WORKERS)))


def _sanitize_nested(sanitize_string):
    """nbval applies the sanitize file's regexes to string outputs only; a plotly figure's output is a JSON dict,
    whose strings (a title's "CPU (2 threads)") it compared raw. Apply them to every string inside as well."""

    def sanitize(self, value):
        if isinstance(value, dict):
            return {key: sanitize(self, item) for key, item in value.items()}
        if isinstance(value, list):
            return [sanitize(self, item) for item in value]
        return sanitize_string(self, value)

    return sanitize


IPyNbCell.sanitize = _sanitize_nested(IPyNbCell.sanitize)


def pytest_configure(config):
    if getattr(config.option, "nbval_sanitize_with", None) is None:
        config.option.nbval_sanitize_with = str(SANITIZE_FILE)


def pytest_collection_modifyitems(config, items):
    """Every nbval item is a notebook cell: marked ``notebook`` so that ``make test-fast`` can leave them out."""
    for item in items:
        if isinstance(item, IPyNbCell) or item.path.suffix == ".ipynb":
            item.add_marker("notebook")
