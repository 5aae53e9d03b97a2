"""The CPU products for GGUF blocks: a small C++ extension of our own, torch's packed int4 kernel, the reference.

Why three: a batch-1 decode step reads every weight once, so on the CPU the product has to read the 4-bit blocks
themselves. Two candidates do, and were measured at the model's shapes (`benchmarks/bench_gguf_cpu.py`):

* ``cpp``: `gguf_cpu.cpp` and `gguf_cpu_layer.cpp`, built with ``torch.utils.cpp_extension`` into the cache
  directory by ``workbench fetch`` (so by ``make setup``) or on first use: two sources of ~5 s of CPU each, mostly
  parsing the few ATen headers they include, compiled side by side; the building CPU's vector instructions.
  It converts each block to exactly the dequantized float32 weights in registers and runs 1-4 activation rows
  over them at once, threads over output rows through ATen's OpenMP pool. Q4_1 and Q8_0.
* ``int4pack``: ``torch._weight_int4pack_mm_for_cpu``, whose weights are ``(q - 8) * scale + zero``: a Q4_1 block
  ``d * q + m`` maps to ``scale = d, zero = m + 8 d``, exactly wherever ``m + 8 d`` is a float32 number (checked
  per block at packing). With float32 activations it is exact but takes a scalar path (~20 ms for one
  3072 x 576 product on the AVX-512 host, 750x the C++ one); its fast path wants bfloat16 activations and
  scales, which round both. So it stays the fallback for Q4_1 when the extension cannot be built.
* the reference: dequantize the blocks with PyTorch operators, then ``F.linear``.

`cpu_product` says which one this process uses and why. A failed build (no compiler, no ninja) falls back with
one warning naming the reason; ``WORKBENCH_GGUF_CPP=0`` skips the extension.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch

from workbench.paths import cache_dir

# The block products, the fused decoder-layer halves built on them, and what they share.
SOURCES = tuple(Path(__file__).with_name(name) for name in ("gguf_cpu.cpp", "gguf_cpu_layer.cpp"))
HEADER = Path(__file__).with_name("gguf_cpu.h")
LIBRARY = "workbench_gguf"  # the TORCH_LIBRARY namespace in gguf_cpu.cpp
GGML_Q4_1, GGML_Q8_0 = 3, 8  # ggml's type ids, as `gguf.GGMLQuantizationType` numbers them
FLAGS = ("-O3", "-march=native", "-std=c++20", "-fopenmp")


def _cpu_fingerprint() -> str:
    """What -march=native depends on: the CPU's model and flags (a cache directory may be shared by hosts)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [line for line in lines if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(wanted)))


def build_directory() -> Path:
    """Where this source, torch version, compiler flags and CPU get their build (never shared across them)."""
    digest = hashlib.sha256()
    for part in (*(p.read_bytes() for p in (*SOURCES, HEADER)), torch.__version__.encode(),
                 " ".join(FLAGS).encode(), _cpu_fingerprint().encode()):
        digest.update(part)
    return cache_dir() / "torch_extensions" / f"gguf_cpu-{digest.hexdigest()[:16]}"


class ExtensionStatus:
    """The outcome of building and loading the extension in this process (one owner: `extension`)."""

    def __init__(self, loaded: bool, reason: str, seconds: float = 0.0, vector_path: str = ""):
        self.loaded, self.reason, self.seconds, self.vector_path = loaded, reason, seconds, vector_path

    def __repr__(self) -> str:
        return f"ExtensionStatus(loaded={self.loaded}, reason={self.reason!r}, vector_path={self.vector_path!r})"


@functools.cache
def extension() -> ExtensionStatus:
    """Build (first use on this machine) and load the C++ extension; never raises: a failure is a status."""
    if os.environ.get("WORKBENCH_GGUF_CPP", "1") == "0":
        return ExtensionStatus(False, "WORKBENCH_GGUF_CPP=0")
    if platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"):
        return ExtensionStatus(False, f"no build for {platform.machine()}")
    start = time.perf_counter()
    try:
        from torch.utils import cpp_extension

        _put_venv_ninja_on_path()
        cpp_extension.verify_ninja_availability()
        directory = build_directory()
        directory.mkdir(parents=True, exist_ok=True)
        cpp_extension.load(name="workbench_gguf_cpu", sources=[str(p) for p in SOURCES], extra_cflags=list(FLAGS),
                           extra_ldflags=["-fopenmp"], build_directory=str(directory), is_python_module=False,
                           verbose=False)
        path = torch.ops.workbench_gguf.vector_path()
    except Exception as exc:  # noqa: BLE001 - compiler, ninja, linker, loader: every failure means "use another"
        reason = f"could not build the GGUF CPU extension ({type(exc).__name__}: {str(exc).strip()[:300]})"
        warnings.warn(f"{reason}; GGUF weights use a slower product on this CPU", RuntimeWarning, stacklevel=2)
        return ExtensionStatus(False, reason, time.perf_counter() - start)
    return ExtensionStatus(True, "built" if time.perf_counter() - start > 1 else "loaded",
                           time.perf_counter() - start, path)


def _put_venv_ninja_on_path() -> None:
    """cpp_extension looks for ``ninja`` on PATH; the project installs it into its virtual environment (the ``ninja``
    wheel), whose bin directory is not on PATH when the environment's python is run without activating it."""
    beside = Path(sys.executable).with_name("ninja")
    if shutil.which("ninja") is None and beside.is_file():
        os.environ["PATH"] = f"{beside.parent}{os.pathsep}{os.environ.get('PATH', '')}"


def cpp_linear(x: torch.Tensor, blocks: torch.Tensor, kind: int) -> torch.Tensor:
    """The extension's product (x [M, K] float32 contiguous along K); `extension` must have loaded."""
    return torch.ops.workbench_gguf.linear(x, blocks, kind)


def cpp_dequantize(blocks: torch.Tensor, kind: int, in_features: int) -> torch.Tensor:
    return torch.ops.workbench_gguf.dequantize(blocks, kind, in_features)


def cpu_product(kind: int) -> str:
    """The product this process uses on the CPU for ``kind``: ``cpp``, ``int4pack`` (Q4_1 only) or ``reference``."""
    if extension().loaded:
        return "cpp"
    if kind == GGML_Q4_1 and int4pack_available():
        return "int4pack"
    return "reference"


@functools.cache
def int4pack_available() -> bool:
    return hasattr(torch, "_weight_int4pack_mm_for_cpu") and hasattr(torch, "_convert_weight_to_int4pack_for_cpu")


def int4pack_weights(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """torch's packed int4 form of Q4_1 weights ``d * q + m`` (codes [N, K] uint8 in 0..15, d and m [N, K/32]
    float32): ``(packed, scales_and_zeros)``, or None where some ``m + 8 d`` is not exact in float32 (the
    mapping would change a weight) or torch has no such kernel."""
    if not int4pack_available():
        return None
    zero = m + 8 * d
    # m and 8 d come from fp16 numbers, so their exact sum is a float64 number: compare with it.
    if not bool((zero.double() == m.double() + 8 * d.double()).all()):
        return None
    packed = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    scales_and_zeros = torch.stack([d.T, zero.T], dim=-1).contiguous()  # [K/32, N, 2]
    return packed, scales_and_zeros


def int4pack_linear(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch._weight_int4pack_mm_for_cpu(x, packed[0], 32, packed[1])
