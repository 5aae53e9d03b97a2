"""llama.cpp as a measured peer: its ``llama-bench``, built once from the llama-cpp-python sdist, on the same GGUF.

Why it exists: the real model ships as a GGUF file, and llama.cpp is the engine that file was made for; its speed on
the learner's own CPU is the reference a hand-tuned C++ engine reaches. ``benchmarks/bench_vs_llamacpp.py``
measures both engines side by side and stores the result (`RESULT_PATH`), which chapter 6's weight-format panel
draws with the machine it was measured on; where ``llama-bench`` has been built on this machine, the panel can
also run it live.

The build (`build_llama_bench`) downloads the sdist with pip, unpacks the llama.cpp it vendors and compiles only
the ``llama-bench`` target with the building CPU's instructions (``GGML_NATIVE``), into the cache directory: 33
minutes at low priority on the shared 2-core machine while it was busy (2026-11-26). Nothing here runs in the test
suite's default command.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from workbench.paths import DATASETS_DIR, cache_dir

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF")
RESULT_PATH = DATASETS_DIR / "eval" / "vs_llamacpp.json"
BUILD_COMMAND = ".venv/bin/python benchmarks/bench_vs_llamacpp.py --build"


def build_root() -> Path:
    return cache_dir() / "llama.cpp" / LLAMA_CPP_PYTHON.replace("==", "-")


def llama_bench_path() -> Path:
    return build_root() / "build" / "bin" / "llama-bench"


def build_llama_bench(jobs: int) -> Path:
    """Download the sdist with pip, unpack its vendored llama.cpp and build ``llama-bench`` (once per machine)."""
    root = build_root()
    if llama_bench_path().is_file():
        return llama_bench_path()
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"building llama-bench needs {tool} on PATH")
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if not list(root.glob("llama_cpp_python-*.tar.gz")):
        subprocess.run([sys.executable, "-m", "pip", "download", LLAMA_CPP_PYTHON, "--no-binary", ":all:",
                        "--no-deps", "-d", str(root)], check=True)
    source = root / "src"
    if not (source / "CMakeLists.txt").is_file():
        with tarfile.open(next(root.glob("llama_cpp_python-*.tar.gz"))) as tar:
            members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name]
            for member in members:
                member.name = member.name.split("/vendor/llama.cpp/", 1)[1]
            tar.extractall(source, members=members, filter="data")
    build = root / "build"
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-bench", "-j", str(jobs)], check=True)
    info = {"package": LLAMA_CPP_PYTHON, "cmake_flags": list(CMAKE_FLAGS),
            "build_s": round(time.perf_counter() - start)}
    (root / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return llama_bench_path()


def run_llama_bench(gguf: Path, threads: int, prompt: int, decode: int, repetitions: int = 1) -> dict[str, float]:
    """llama-bench's prefill (``pp``) and decode (``tg``) tokens/s on ``gguf``: ``{"prefill": .., "decode": ..}``."""
    binary = llama_bench_path()
    if not binary.is_file():
        raise FileNotFoundError(f"llama-bench is not built on this machine ({binary}); run `{BUILD_COMMAND}`")
    if threads < 1 or prompt < 0 or decode < 0 or repetitions < 1:
        raise ValueError(f"threads and repetitions must be >= 1 and token counts >= 0, got threads={threads}, "
                         f"prompt={prompt}, decode={decode}, repetitions={repetitions}")
    out = subprocess.run([str(binary), "-m", str(gguf), "-t", str(threads), "-p", str(prompt), "-n", str(decode),
                          "-r", str(repetitions), "-o", "json"], check=True, capture_output=True, text=True).stdout
    result = {}
    for test in json.loads(out):
        result["decode" if test["n_gen"] else "prefill"] = float(test["avg_ts"])
    return result


@dataclass(frozen=True)
class PeerResult:
    """A stored side-by-side run (`RESULT_PATH`): medians per engine, and where and how they were measured."""

    machine: str
    threads: int
    date: str
    decode: dict[str, float]  # engine -> median decode tokens/s ("llama.cpp", "q4_1", ...)
    prefill: dict[str, float]
    decode_tokens: int
    prompt_tokens: int
    load_average: tuple[float, ...]

    @property
    def label(self) -> str:
        return (f"llama.cpp llama-bench tg{self.decode_tokens}, {self.threads} threads, measured {self.date} on "
                f"{self.machine}")


def load_result(path: Path | None = None) -> PeerResult | None:
    """The stored side-by-side run (`RESULT_PATH` unless ``path``), or None where none was stored."""
    path = RESULT_PATH if path is None else path
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return PeerResult(raw["machine"], raw["threads"], raw["date"], raw["decode"], raw["prefill"],
                      raw["decode_tokens"], raw["prompt_tokens"], tuple(raw["load_average"]))
