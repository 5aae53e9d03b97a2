"""Wall-clock timing of device work, one copy for the engine's roofline and the notebooks' lab.

Device work is asynchronous on CUDA: a host clock read right after a launch measures the launch, not the work,
so every timed region is bracketed by a synchronize. The fastest of several runs is reported because on a shared
machine noise only ever adds time; a warm-up run comes first so that compilation, allocation and caches stay
out of the number.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch


def sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op on the CPU, where work is synchronous)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(fn: Callable[[], object], device: torch.device | str, *, repeats: int = 3,
                 min_total_s: float = 0.2, warmup: bool = True) -> float:
    """Fastest of at least ``repeats`` runs of ``fn()`` (and at least ``min_total_s`` of runs), after one warm-up
    run unless ``warmup=False``, in seconds."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup:
        fn()
        sync(device)
    times: list[float] = []
    while len(times) < repeats or sum(times) < min_total_s:
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def describe_cpu() -> str:
    """The CPU timings were taken on: architecture, model, threads, the vector ISA PyTorch's kernels use and the
    last-level cache. The project's 2-core machine is not always the same CPU, and ratios depend on it (the int8 /
    fp32 decode ratio measured 1.28x on an AVX2 host and 1.69x on an AVX-512 VNNI one: benchmarks/RESULTS.md)."""
    model = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        model = names[0] if names else model
    parts = [platform.machine(), model, f"{torch.get_num_threads()} threads", torch.backends.cpu.get_cpu_capability()]
    llc = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")
    if llc.is_file():
        size = llc.read_text().strip()  # e.g. "266240K"
        parts.append(f"L3 {int(size[:-1]) // 1024} MiB" if size.endswith("K") else f"L3 {size}")
    return ", ".join(p for p in parts if p)


def describe_machine(device: torch.device | str) -> str:
    """The GPU's name, or the CPU's description: what a timing was measured on."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"{describe_cpu()}, torch {torch.__version__}"
