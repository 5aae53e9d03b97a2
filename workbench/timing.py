"""Wall-clock timing of device work, one copy for the engine's roofline and the notebooks' lab.

Device work is asynchronous on CUDA: a host clock read right after a launch measures the launch, not the work,
so every timed region is bracketed by a synchronize. The fastest of several runs is reported because on a shared
machine noise only ever adds time; a warm-up run comes first so that compilation, allocation and caches stay
out of the number.
"""

from __future__ import annotations

import time
from collections.abc import Callable

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
