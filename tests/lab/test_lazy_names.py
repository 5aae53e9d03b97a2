"""Every name a chapter package exports lazily resolves: a table entry pointing at a module that lost the name (a
rename, a move) would otherwise fail only in the notebook cell that first uses it."""

from __future__ import annotations

import importlib

import pytest

CHAPTERS = [f"ch{n:02d}" for n in range(1, 12)]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_exported_name_resolves(chapter):
    package = importlib.import_module(f"workbench.lab.{chapter}")
    names = dir(package)
    assert names, f"{chapter} exports nothing"
    missing = []
    for name in names:
        try:
            getattr(package, name)
        except (AttributeError, ImportError) as exc:
            missing.append(f"{name}: {exc}")
    assert not missing, missing
