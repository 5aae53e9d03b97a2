"""The kit's shared pieces: labels, the panel base (measured on demand, once per change, controls disabled while
measuring), traces by name, the closing table's verdicts, and lazy chapter exports."""

from __future__ import annotations

import subprocess
import sys

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch

from workbench.lab.kit.closing import ClosingTable, Takeaway, Verdict
from workbench.lab.kit.evidence import Evidence
from workbench.lab.kit.figures import set_trace, trace
from workbench.lab.kit.lazy import lazy_exports
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


class CountingPanel(LabPanel):
    def __init__(self, calls: list):
        self.calls = calls
        self.a, self.b = widgets.IntSlider(), widgets.IntSlider()
        self.shown = widgets.Checkbox()
        super().__init__([self.a, self.b], [], redraw_only=[self.shown])

    def measure(self):
        self.calls.append(("measure", self.a.disabled))
        return self.a.value + self.b.value

    def draw(self):
        self.calls.append(("draw", self.a.value, self.b.value))


def test_a_panel_measures_when_asked_not_when_built():
    calls: list = []
    panel = CountingPanel(calls)
    assert calls == [] and not panel.measured
    assert panel.run() is panel and panel.result == 0
    assert calls == [("measure", True), ("draw", 0, 0)]


def test_result_runs_a_panel_that_never_ran():
    calls: list = []
    panel = CountingPanel(calls)
    panel.b.value = 0  # no change: nothing runs
    assert panel.result == 0 and [c[0] for c in calls] == ["measure", "draw"]


def test_panel_holds_changes_and_reenables_controls():
    calls: list = []
    panel = CountingPanel(calls).run()
    calls.clear()
    panel.a.value = 1
    assert calls == [("measure", True), ("draw", 1, 0)] and panel.result == 1
    calls.clear()
    with panel.changes():
        panel.a.value, panel.b.value = 2, 3
    assert calls == [("measure", True), ("draw", 2, 3)] and panel.result == 5
    assert not panel.a.disabled
    calls.clear()
    panel.shown.value = True  # a redraw-only control does not re-measure
    assert calls == [("draw", 2, 3)]


def test_a_redraw_only_control_changed_first_measures_first():
    calls: list = []
    panel = CountingPanel(calls)
    panel.shown.value = True
    assert [c[0] for c in calls] == ["measure", "draw"] and panel.measured


def test_traces_are_found_by_name_with_clear_errors():
    fig = go.Figure([go.Scatter(name="measured", y=[1]), go.Scatter(name="theory", y=[2]),
                     go.Scatter(name="twice", y=[3]), go.Scatter(name="twice", y=[4])])
    assert trace(fig, "theory").y == (2,)
    set_trace(fig, "measured", y=[5, 6])
    assert trace(fig, "measured").y == (5, 6)
    with pytest.raises(KeyError, match="no trace named 'missing'.*'measured', 'theory'"):
        trace(fig, "missing")
    with pytest.raises(KeyError, match="2 traces named 'twice'"):
        trace(fig, "twice")


FOR = Evidence.exact("a count", 3, 1)
AGAINST = Evidence.exact("a count", 0, 1)


def test_verdicts_are_judged_and_typed_strings_are_refused():
    assert Verdict.judge(FOR) is Verdict.HOLDS
    assert Verdict.judge(FOR, caveat=True) is Verdict.CAVEAT
    assert Verdict.judge([FOR, AGAINST], caveat=True) is Verdict.WRONG
    with pytest.raises(ValueError, match="must be a Verdict"):
        Takeaway("claim", "measured", "holds", evidence=(FOR,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a note"):
        Takeaway("claim", "measured", Verdict.WRONG, evidence=(AGAINST,))
    with pytest.raises(ValueError, match="at least one"):
        ClosingTable([])


def test_the_closing_table_is_stored_whole():
    long = "a measured sentence " * 12
    table = ClosingTable([Takeaway("The seed's first takeaway, quoted in full.", long.strip(), Verdict.HOLDS,
                                   evidence=(FOR,)),
                          Takeaway("Second.", "measured 2", Verdict.CAVEAT, "only at batch 1", evidence=(FOR,))])
    html = table._repr_html_()
    assert "closing-table" in html and long.strip() in html and "…" not in html
    assert "holds with a caveat: only at batch 1" in html and "holds with a caveat: only at batch 1" in repr(table)
    assert table.verdicts == [Verdict.HOLDS, Verdict.CAVEAT]
    frame = table.frame()
    assert list(frame.columns) == ["the book's takeaway", "measured here", "evidence (n, effect, margin)",
                                   "verdict"] and len(frame) == 2
    assert "a count: effect 3.00x (claim: &gt; 1.00x); computed, exact (no noise)" in html
    assert "evidence: a count: effect 3.00x (claim: > 1.00x)" in repr(table)


def test_lazy_exports_import_on_first_use_and_name_unknowns():
    getattr_, dir_ = lazy_exports("pkg", {"Verdict": "workbench.lab.kit.closing"})
    assert getattr_("Verdict") is Verdict and dir_() == ["Verdict"]
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        getattr_("Nope")


def test_engine_imports_without_the_lab():
    """Importing every engine module loads neither the lab nor plotly nor ipywidgets."""
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


def test_without_a_kernel_the_controls_say_where_they_live():
    from workbench.lab.kit.panel import LIVE_CONTROLS_NOTE

    bundle = CountingPanel([]).controls_bundle()
    assert bundle["text/plain"] == LIVE_CONTROLS_NOTE and "VBox" not in str(bundle["text/plain"])
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"]


def test_a_baseline_is_measured_numbers_carried_as_metadata():
    import nbformat

    from workbench.lab.kit.baseline import METADATA_KEY, Baseline, stored_baselines

    base = Baseline("ch04", "test CPU", "float32", "roofline steps", decode_step_ms=31.5, prefill_ms_per_token=1.9,
                    prefill_tokens=512)
    assert "decode step 31.5 ms" in base.line() and "1.90 ms per token at 512 tokens" in base.line()
    with pytest.raises(ValueError, match="at least one"):
        Baseline("ch01", "cpu", "float32", "x")
    with pytest.raises(ValueError, match="positive"):
        Baseline("ch01", "cpu", "float32", "x", decode_step_ms=0.0)
    with pytest.raises(ValueError, match="prefill_tokens"):
        Baseline("ch01", "cpu", "float32", "x", prefill_ms_per_token=2.0)
    nb = nbformat.v4.new_notebook()
    out = nbformat.v4.new_output("display_data", data={"text/plain": base.line()},
                                 metadata={METADATA_KEY: {"chapter": "ch04", "decode_step_ms": 31.5}})
    nb.cells = [nbformat.v4.new_code_cell(outputs=[out])]
    assert stored_baselines(nb) == [{"chapter": "ch04", "decode_step_ms": 31.5}]
