"""One call on a lent GPU: every prepared measurement in priority order, each time-boxed, all results under $OUT.

Why it exists: a lent GPU comes with about 15 minutes of device time in all, start-up included, so there is no
room to set up, debug and measure in several calls. This script is that one call. Each step runs in its own
process with a time limit (the smaller of its cap and what is left of ``--budget-s``); a step that fails,
hangs or runs over is recorded and the next one starts, so one broken measurement never costs the others.
``session.json`` (steps, status, seconds) and every step's log are written as the run goes, so whatever
finished comes back even if the call itself is cut off. The same script runs on the CPU in the test suite
(``--device cpu --tiny``: tiny shapes, same code paths), so it cannot rot between GPU runs.

    python3 benchmarks/gpu_session.py --out "$OUT" --pack --budget-s 540               # on the GPU machine
    python benchmarks/gpu_session.py --device cpu --tiny --out /tmp/dry --budget-s 300  # the dry run
    python benchmarks/gpu_session.py --list                                            # the steps

The GPU machine has torch, triton, transformers, numpy, pandas and safetensors but not this project's install:
the script exposes ``kernels/`` as ``workbench_kernels`` and runs everything from the source tree.

The real model's steps run only when named. Its GGUF (98 MB) travels in parts, one per call, on a machine kept
warm between calls (it is released 30 s after a call ends, so the next call must follow at once):
``python benchmarks/gpu_parts.py prepare --parts 3`` here; then for part 1 and 2 ``gpu_parts.py stage N`` and a
call of ``gpu_session.py --pack --steps stash`` (plus any short steps) with the device tool's ``carry:
[".gpu_part"]``; then ``stage 3`` and a call with ``--steps stash,real-model,real-tests,real-spec``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Where the GPU changes the lesson first.
CHAPTER_ORDER = ("ch04", "ch05", "ch07", "ch02", "ch06", "ch01", "ch10", "ch11")


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    cap_s: int  # the most it may take
    min_s: int  # not started with less than this left
    gpu: list[str]  # the command on the GPU (placeholders: {py} {out})
    dry: list[str] | None  # the command for the CPU dry run; None: the step needs CUDA
    why: str = ""


def _steps() -> list[Step]:
    py = "{py}"
    chapters = [Step(f"chapter-{c}", 75, 15, [py, "benchmarks/gpu_chapters.py", "--chapter", c, "--out",
                                              "{out}/gpu_results"],
                     [py, "benchmarks/gpu_chapters.py", "--chapter", c, "--out", "{out}/gpu_results", "--device",
                      "cpu", "--tiny"], f"chapter {c[2:]}'s measurement on the device")
                for c in CHAPTER_ORDER]
    pytest = [py, "-m", "pytest", "-o", "addopts=--import-mode=importlib -ra", "-p", "no:cacheprovider",
              "--continue-on-collection-errors", "-q"]
    return [
        Step("env", 30, 5, [py, "benchmarks/gpu_session.py", "--describe"],
             [py, "benchmarks/gpu_session.py", "--describe"], "device, driver and library versions"),
        Step("tests", 160, 60, [*pytest, "-n", "8", "-m", "gpu", "{gpu_test_files}", "--junitxml",
                                "{out}/gpu_tests.xml"],
             [*pytest, "-m", "gpu", "tests/engine/test_gpu_engine.py", "tests/kernels/test_kernel_fused_layer_ops.py",
              "--collect-only"], "every test marked gpu (on the CPU: two of its files collected)"),
        Step("engine", 150, 40, [py, "benchmarks/bench_gpu_engine.py", "--json", "{out}/gpu_engine.json"],
             [py, "benchmarks/bench_gpu_engine.py", "--device", "cpu", "--tiny", "--batches", "1,4", "--prompt", "16",
              "--new-tokens", "16", "--json", "{out}/gpu_engine.json"],
             "decode speed: graphs and fused kernels on/off, replay time, kernel census"),
        Step("formats", 90, 30, [py, "benchmarks/bench_gpu_kernels.py", "--parts", "formats", "--json",
                                 "{out}/gpu_formats.json"], None, "quantized KV decode attention against bf16"),
        *chapters,
        Step("kernels", 200, 60, [py, "benchmarks/bench_gpu_kernels.py", "--json", "{out}/gpu_kernels.json"], None,
             "the full decode/prefill kernel sweep against the device's peaks"),
        # The real model, when its GGUF was carried here in parts (benchmarks/gpu_parts.py): not in the default run
        Step("stash", 20, 2, [py, "benchmarks/gpu_parts.py", "stash"], None,
             "keep the part this call carried (.gpu_part/) for a later call on the same warm machine"),
        Step("real-model", 120, 30, [py, "benchmarks/gpu_parts.py", "assemble"], None,
             "join the stashed parts, check their SHA-256, install gguf, convert the real model"),
        Step("real-tests", 150, 40, [*pytest, "tests/engine/test_gpu_engine.py", "-k", "real"], None,
             "the real SmolLM2 on CUDA, token for token against transformers, eager and graphed"),
        Step("real-spec", 240, 60, [py, "benchmarks/bench_spec_decode.py", "--device", "cuda", "--parts", "trees",
                                    "--budgets", "8,16,32,64", "--chat-prompts", "8", "--max-tokens", "96"], None,
             "chains and token trees with the trained draft on the real model: tokens per pass, speed-up"),
    ]


REAL_MODEL_STEPS = ("stash", "real-model", "real-tests", "real-spec")


@dataclass
class Session:
    out: Path
    budget_s: float
    dry: bool
    pack_to: Path | None = None
    started: float = field(default_factory=time.monotonic)
    records: list[dict] = field(default_factory=list)

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def save(self) -> None:
        """session.json, and everything so far packed into ``<out>/../<name>.tgz`` beside it when ``pack_to`` is
        set (the device tool brings back only a few files, and only what is under its $OUT)."""
        (self.out / "session.json").write_text(json.dumps({"dry_run": self.dry, "budget_s": self.budget_s,
                                                           "steps": self.records}, indent=1))
        if self.pack_to is not None:
            shutil.copy(self.out / "session.json", self.pack_to / "session.json")
            with tarfile.open(self.pack_to / "session.tgz", "w:gz") as tar:
                tar.add(self.out, arcname="gpu_session")

    def run(self, step: Step, env: dict[str, str]) -> None:
        command = step.dry if self.dry else step.gpu
        record = {"step": step.name, "why": step.why, "status": "skipped", "seconds": 0.0, "log": None}
        self.records.append(record)
        left = self.left() - 5  # keep a few seconds to write the summary
        if command is None:
            record["reason"] = "needs CUDA"
        elif left < step.min_s:
            record["reason"] = f"{left:.0f} s left, needs {step.min_s}"
        else:
            record.update(self._execute(step, command, min(step.cap_s, left), env))
        self.save()
        print(f"=== {step.name}: {record['status']} ({record['seconds']:.0f} s){' ' + record.get('reason', '')}",
              flush=True)
        if record["status"] != "ok" and record["log"]:
            tail = Path(record["log"]).read_text(errors="replace").splitlines()[-12:]
            print("\n".join(f"    {line[:200]}" for line in tail), flush=True)

    def _execute(self, step: Step, command: list[str], limit: float, env: dict[str, str]) -> dict:
        argv = []
        for part in command:
            argv += gpu_test_files() if part == "{gpu_test_files}" else [part.format(py=sys.executable, out=self.out)]
        log = self.out / "logs" / f"{step.name}.log"
        start = time.monotonic()
        with log.open("w") as sink:
            sink.write(f"$ {' '.join(argv)}\n")
            sink.flush()
            process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            try:
                rc = process.wait(timeout=limit)
                status = "ok" if rc == 0 else "failed"
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                rc, status = None, "timeout"
        return {"status": status, "rc": rc, "seconds": round(time.monotonic() - start, 1), "limit_s": round(limit),
                "log": str(log)}


def gpu_test_files() -> list[str]:
    """The test files with GPU tests: collecting the others would fail on the GPU machine, which has no FastAPI,
    Jupyter or plotly (they test the server, the lab and the notebooks, which CI runs on the CPU)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "mark.gpu" in p.read_text())


def environment(dry: bool) -> dict[str, str]:
    """PYTHONPATH with the source tree and ``kernels/`` importable as ``workbench_kernels``."""
    shim = Path(tempfile.mkdtemp(prefix="wb-kernels-"))
    (shim / "workbench_kernels").symlink_to(ROOT / "kernels")
    env = dict(os.environ, PYTHONUNBUFFERED="1", KINETO_LOG_LEVEL="6")
    extra = [] if dry else ["/root/gguf", "/tmp/site"]  # the real model's package dir and gguf (gpu_parts.py)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(shim), *extra, *filter(None, [env.get("PYTHONPATH")])])
    if not dry:
        env.setdefault("WORKBENCH_CACHE", "/root/wbcache")
    return env


def describe() -> None:
    import platform

    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(multiprocessors=props.multi_processor_count, memory_GiB=round(props.total_memory / 2**30, 1))
        try:
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            info["nvidia_smi"] = f"unavailable: {exc}"
    for name in ("triton", "transformers", "numpy", "pandas", "safetensors"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    print(json.dumps(info))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_out"),
                        help="where results and logs go (on the device tool: its $OUT)")
    parser.add_argument("--pack", action="store_true",
                        help="work in a folder of its own and keep <out> to two files: session.json and "
                             "session.tgz with every result and log, refreshed after each step (the device tool "
                             "brings back a few files only)")
    parser.add_argument("--budget-s", type=float, default=540, help="wall-clock seconds for all steps together")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="with --device cpu: the dry run's tiny shapes")
    parser.add_argument("--steps", default=None, help="comma-separated step names (default: all, in order)")
    parser.add_argument("--list", action="store_true", help="list the steps and exit")
    parser.add_argument("--describe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.describe:
        return describe()
    steps = _steps()
    if args.list:
        for step in steps:
            print(f"{step.name:<16} cap {step.cap_s:>4} s  {step.why}")
        return None
    dry = args.device == "cpu"
    if dry and not args.tiny:
        parser.error("the CPU run is the dry run: pass --tiny (full shapes need a GPU)")
    if args.steps:
        wanted = args.steps.split(",")
        unknown = set(wanted) - {s.name for s in steps}
        if unknown:
            parser.error(f"unknown steps {sorted(unknown)}; see --list")
        steps = [s for s in steps if s.name in wanted]
    else:  # the real model's steps need its parts carried beforehand: asked for by name only
        steps = [s for s in steps if s.name not in REAL_MODEL_STEPS]
    out = Path(tempfile.mkdtemp(prefix="gpu-session-")) if args.pack else Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    session = Session(out, args.budget_s, dry, pack_to=Path(args.out) if args.pack else None)
    env = environment(dry)
    for step in steps:
        session.run(step, env)
    statuses = [r["status"] for r in session.records]
    print(json.dumps({"session": str(out / "session.json"), "ok": statuses.count("ok"),
                      "failed": statuses.count("failed"), "timeout": statuses.count("timeout"),
                      "skipped": statuses.count("skipped")}))
    return None


if __name__ == "__main__":
    main()
