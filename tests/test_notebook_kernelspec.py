"""A stored notebook opens in JupyterLab unchanged. JupyterLab rewrites a notebook's ``kernelspec`` to the running
kernel's when it starts it; the stored notebooks said "Python 3" where the installed kernel says "Python 3
(ipykernel)", so every chapter opened marked unsaved (closing it asked to save; saving rewrote the stored file).
notebooks/refresh_outputs.py now writes the installed kernel's spec."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "notebooks"))
from refresh_outputs import KERNEL, kernelspec_metadata  # noqa: E402

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
