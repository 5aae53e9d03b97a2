"""pyproject.toml lists the packages explicitly (kernels/ installs as workbench_kernels), so a new subpackage
left out of the list would be missing from a non-editable install: every package in the tree must be listed."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_workbench_package_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "workbench").rglob("__init__.py")}
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert "workbench_kernels" in listed


def test_every_listed_package_exists():
    """The other direction: a listed package with no folder (or no __init__.py, which git does not keep for an
    empty folder) stops `pip install -e .` on a fresh clone with 'package directory ... does not exist'."""
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    dirs = {"workbench_kernels": ROOT / "kernels"}
    missing = [name for name in listed
               if not (dirs.get(name, ROOT.joinpath(*name.split("."))) / "__init__.py").exists()]
    assert not missing, f"listed in pyproject.toml but absent from the tree: {missing}"
