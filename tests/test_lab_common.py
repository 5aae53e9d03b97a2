"""The lab's shared pieces, and the rule that the engine never depends on the lab."""

from __future__ import annotations

import subprocess
import sys

import plotly.io as pio
import torch

from workbench.lab.kit.notebook import device_label, fmt_bytes, measured_on, setup_notebook
from workbench.lab.kit.panel import LabPanel


def test_setup_notebook_pins_the_plotly_renderer():
    pio.renderers.default = "json"
    setup_notebook()
    assert pio.renderers.default == "plotly_mimetype"


def test_labels_name_device_dtype_and_model():
    assert device_label("cpu").startswith("CPU (")

    class Fake:
        spec = type("S", (), {"name": "llama-3-8b"})()
        device, dtype = torch.device("cpu"), torch.bfloat16

    label = measured_on(Fake())
    assert "bfloat16" in label and "CPU" in label and "random weights" in label
    assert fmt_bytes(3 * 2**30) == "3.00 GiB" and fmt_bytes(512) == "512 B"


def test_panel_holds_changes_and_reenables_controls():
    import ipywidgets as widgets

    calls = []

    class Panel(LabPanel):
        def __init__(self):
            self.a, self.b = widgets.IntSlider(), widgets.IntSlider()
            super().__init__([self.a, self.b], [])

        def measure(self):
            calls.append(("measure", self.a.disabled))

        def draw(self):
            calls.append(("draw", self.a.value, self.b.value))

    panel = Panel()
    panel.a.value = 1
    assert calls == [("measure", True), ("draw", 1, 0)]
    calls.clear()
    with panel.changes():
        panel.a.value, panel.b.value = 2, 3
    assert calls == [("measure", True), ("draw", 2, 3)]
    assert not panel.a.disabled


def test_engine_imports_without_the_lab():
    """Nothing outside workbench.lab imports it (or plotly / ipywidgets)."""
    code = (
        "import importlib, pathlib, sys, workbench\n"
        "root = pathlib.Path(workbench.__file__).parent\n"
        "for path in sorted(root.rglob('*.py')):\n"
        "    parts = path.relative_to(root.parent).with_suffix('').parts\n"
        "    if 'lab' not in parts:\n"
        "        importlib.import_module('.'.join(p for p in parts if p != '__init__'))\n"
        "bad = sorted(n for n in sys.modules if n.startswith(('workbench.lab', 'plotly', 'ipywidgets')))\n"
        "print(bad)\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
