"""Chapter packages export their names lazily, so that importing ``workbench.lab.ch05.runs`` (measurements, no
widgets) does not load ``panels`` (ipywidgets, plotly) through the package's ``__init__``.

A chapter's ``__init__`` lists every exported name beside the module that owns it; the table is the chapter's
table of contents, and the first access of a name imports its module (PEP 562).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, owners: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` exporting each name of ``owners`` from its module: a
    submodule name of the package (``"runs"``) or an absolute module (``"workbench.lab.kit.notebook"``)."""

    def module_of(name: str) -> str:
        owner = owners[name]
        return owner if "." in owner else f"{package}.{owner}"

    def __getattr__(name: str) -> object:
        if name not in owners:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module_of(name)), name)

    def __dir__() -> list[str]:
        return sorted(owners)

    return __getattr__, __dir__


# What every chapter package re-exports from the kit, so that a notebook's set-up cell is one import (and its
# last cell, the kernel's memory note, needs none).
NOTEBOOK_NAMES = {**{name: "workbench.lab.kit.notebook" for name in (
    "setup_notebook", "notebook_device", "measured_on", "say", "show_table")},
    "show_memory_note": "workbench.lab.kit.memory"}
