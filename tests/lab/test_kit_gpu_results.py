"""GPU result files and the chapters that draw them beside the learner's device.

Run against the files the project stores (the H100 run of 2026-11-23, converted, and the H200 run of 2026-11-26),
so a file whose format drifts from what the chapters read fails here, not in front of a reader.
"""

from __future__ import annotations

import json
from importlib import import_module

import pandas as pd
import pytest

from workbench.lab.kit.gpu_beside import GpuBeside
from workbench.lab.kit.gpu_results import GPU_RESULTS_DIR, GpuResult, gpu_results, latest_gpu_result
from workbench.roofline import DevicePeaks

CHAPTERS = ("ch01", "ch02", "ch04", "ch05", "ch06", "ch07", "ch10")


def test_every_stored_file_loads_with_its_provenance():
    files = sorted(GPU_RESULTS_DIR.glob("*/*.json"))
    assert len(files) >= 8
    for path in files:
        result = GpuResult.load(path)
        assert result.chapter == path.stem and result.device and result.date in path.parent.name
        assert "torch" in result.versions and result.command.startswith(("python", "bash"))
        assert "--out" not in result.command, "where a run wrote its files is not part of its command"


def test_the_newest_file_of_a_chapter_wins():
    runs = gpu_results("ch04")
    assert [r.date for r in runs][:2] == ["2026-11-26", "2026-11-23"]
    assert latest_gpu_result("ch04").device == "NVIDIA H200"
    assert latest_gpu_result("ch99") is None


def test_a_file_that_is_not_a_measurement_is_refused(tmp_path):
    (tmp_path / "2026-01-01-x").mkdir()
    path = tmp_path / "2026-01-01-x" / "ch04.json"
    path.write_text(json.dumps({"chapter": "ch04", "device": "x"}))
    with pytest.raises(ValueError, match="lacks dtype"):
        gpu_results("ch04", tmp_path)
    good = json.loads((GPU_RESULTS_DIR / "2026-11-26-h200" / "ch04.json").read_text())
    path.write_text(json.dumps({**good, "tiny": True}))
    with pytest.raises(ValueError, match="dry run"):
        GpuResult.load(path)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_chapter_draws_its_gpu_file_and_says_where_it_comes_from(chapter):
    shown = import_module(f"workbench.lab.{chapter}.on_gpu").on_gpu()
    assert shown.result is not None and shown.figure is not None and shown.figure.data
    assert shown.result.device in shown.text and shown.result.date in shown.text
    assert str(shown.result.path.relative_to(GPU_RESULTS_DIR.parent.parent)) in shown.text
    assert all(s.strip() for s in shown.sentences)


def test_chapter_4_draws_the_h100_file_of_2026_11_23_beside_another_device():
    """The converted H100 file stored no per-step FLOPs; the builder works from intensity and share of the roof.
    The H200's file stands in for "this device" to exercise the side-by-side layout."""
    from workbench.lab.ch04.on_gpu import _builder
    from workbench.lab.ch04.steps import RooflineSteps

    h100 = next(r for r in gpu_results("ch04") if r.date == "2026-11-23")
    h200 = latest_gpu_result("ch04").measurement
    peaks = DevicePeaks(device="cuda", dtype="bfloat16", flops_per_s=h200["peak_flops_per_s"],
                        bytes_per_s=h200["peak_bytes_per_s"], flops_by_probe={}, bandwidth_by_probe={})
    import workbench

    other = RooflineSteps(pd.DataFrame(h200["steps"]), peaks, workbench.model_spec("llama-3-8b"), "an H200",
                          "bfloat16")
    figure, sentences = _builder(other)(h100)
    assert len({t.xaxis for t in figure.data}) == 2  # two devices side by side
    assert "252 FLOP per byte" in sentences[0]  # the H100's ridge, as measured that day
    assert "176.8 FLOP per byte, 1.4x lower" in sentences[-1]  # the two ridges compared (177 against 252)


def test_without_a_file_the_cell_says_how_to_make_one():
    shown = GpuBeside.build("ch99", lambda result: (None, []))
    assert shown.result is None and shown.figure is None
    assert "benchmarks/gpu_chapters.py --chapter ch99" in shown.text
