"""How long this process's threads ran and how long they waited, ready, for a CPU: the kernel's own books
(``/proc/self/task/*/schedstat``: nanoseconds on a CPU, nanoseconds waiting on a run queue, time slices).

A timing taken while the threads waited for a CPU says more about the other processes than about the engine; the
lab's busy-machine signal (`workbench.lab.kit.contention`) and `benchmarks/bench_contention.py` read it here.
"""

from __future__ import annotations

import os
from pathlib import Path

TASKS = Path("/proc/self/task")


def read_books() -> dict[int, tuple[int, int]] | None:
    """Nanoseconds each thread of this process has run and has waited for a CPU, by thread id; None where the
    kernel keeps no such books (not Linux, or schedstat unavailable)."""
    books: dict[int, tuple[int, int]] = {}
    try:
        tids = os.listdir(TASKS)
    except OSError:
        return None
    for tid in tids:
        try:
            fields = (TASKS / tid / "schedstat").read_text().split()
        except OSError:  # the thread ended between the listing and the read
            continue
        if len(fields) >= 2:
            books[int(tid)] = (int(fields[0]), int(fields[1]))
    return books or None


def spent(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]) -> tuple[float, float]:
    """Seconds run and waited between two readings (threads started in between count from zero; threads that
    ended in between are lost, which only makes the reading milder)."""
    run = wait = 0
    for tid, (ran, waited) in after.items():
        ran0, waited0 = before.get(tid, (0, 0))
        run, wait = run + ran - ran0, wait + waited - waited0
    return run / 1e9, wait / 1e9


def wait_share(before: dict[int, tuple[int, int]] | None, after: dict[int, tuple[int, int]] | None) -> float | None:
    """Share of the runnable time between two readings spent waiting for a CPU (None without books or time)."""
    if before is None or after is None:
        return None
    run, wait = spent(before, after)
    return wait / (run + wait) if run + wait > 0 else None
