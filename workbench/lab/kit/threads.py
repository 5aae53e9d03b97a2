"""How many threads torch gets for a lab measurement: every core this process may use when the machine is quiet,
only the cores the rest of the machine left free when it is not.

torch splits each CPU op across its threads and waits for the slowest one, with its OpenMP threads spinning
while they wait. When another process holds one of the cores, the thread on that core stalls every op and the
spinning ones take CPU from it. On the project's 2-core machine (benchmarks/RESULTS.md, "A busy machine"): quiet,
2 threads decode 63.9 tokens/s and 1 thread 44.4; beside one busy loop 2 threads fall to 20.8 while 1 keeps 40.1;
with other jobs running, 2 threads collapsed to 0.5-1.1 and 1 thread kept 5-42. One thread gives up a third of
the speed on a quiet machine, so the choice is made again before every panel measures: look at what the other
processes used over the last ``SAMPLE_S`` seconds (``/proc/stat``, on this process's cores), and give torch the
cores that were free, at least one and never more than it started with (``OMP_NUM_THREADS``, the test suite's
share). ``WORKBENCH_LAB_THREADS=N`` fixes the number instead.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

SAMPLE_S = 0.2
# A choice is reused for this long: a slider dragged through ten values does not sample ten times.
REUSE_S = 5.0
# Tolerance for the others' background use (a browser tab, the Jupyter server): on 2 cores, torch keeps 2 threads
# while the other processes use less than a quarter of a core in all.
SLACK = 0.25
ENV = "WORKBENCH_LAB_THREADS"
PROC_STAT = Path("/proc/stat")
_CEILING: int | None = None
_LAST: tuple[float, tuple[int, ...], ThreadChoice] | None = None  # when, on which cores, what was chosen


@dataclass(frozen=True, slots=True)
class ThreadChoice:
    threads: int  # what torch runs with now
    ceiling: int  # what it started with
    others_cores: float | None  # CPU the other processes used while sampled, in cores (None: unknown)
    reason: str

    @property
    def reduced(self) -> bool:
        return self.threads < self.ceiling


def ceiling() -> int:
    """The thread count torch had the first time the lab asked: the most it will ever be given back."""
    global _CEILING
    if _CEILING is None:
        _CEILING = torch.get_num_threads()
    return _CEILING


def own_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def _busy_ticks(cores: list[int]) -> tuple[int, int] | None:
    """(busy, total) clock ticks of ``cores`` since boot, from /proc/stat; None without it."""
    try:
        lines = PROC_STAT.read_text().splitlines()
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cores}
    busy = total = 0
    for line in lines:
        name, *values = line.split()
        if name in wanted:
            ticks = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return (busy, total) if total else None


class OthersMeter:
    """What other processes used of this process's cores from construction to ``cores_used()``, in cores (this
    process's own CPU time, all its threads, taken out); None where /proc/stat is absent."""

    def __init__(self, cores: list[int] | None = None):
        self.cores = cores if cores is not None else own_cores()
        self.before = _busy_ticks(self.cores)
        self.own_before = time.process_time()

    def cores_used(self) -> float | None:
        after, own_after = _busy_ticks(self.cores), time.process_time()
        if self.before is None or after is None or after[1] <= self.before[1]:
            return None
        share = (after[0] - self.before[0]) / (after[1] - self.before[1])  # busy share of the cores' time
        seconds = (after[1] - self.before[1]) / len(self.cores) / os.sysconf("SC_CLK_TCK")
        return max(0.0, share * len(self.cores) - (own_after - self.own_before) / seconds)


def others_cores(sample_s: float = SAMPLE_S, cores: list[int] | None = None) -> float | None:
    """How many of ``cores`` (default: this process's) other processes kept busy over the next ``sample_s``
    seconds, in cores; this process's own CPU time in the window is taken out. None where /proc/stat is absent."""
    meter = OthersMeter(cores)
    time.sleep(sample_s)
    return meter.cores_used()


def choose_threads(top: int, cores: int, others: float | None) -> int:
    """Threads for torch: the free cores (``cores`` less what others use, with SLACK), within [1, top]."""
    if others is None:
        return top
    return max(1, min(top, math.floor(cores - others + SLACK)))


def adapt_threads(sample_s: float = SAMPLE_S) -> ThreadChoice:
    """Set torch's thread count for the next measurement from the machine's load now; returns the choice."""
    top = ceiling()
    fixed = os.environ.get(ENV)
    if fixed:
        try:
            threads = int(fixed)
        except ValueError:
            raise ValueError(f"{ENV} must be a whole number of threads >= 1, got {fixed!r}") from None
        if threads < 1:
            raise ValueError(f"{ENV} must be a whole number of threads >= 1, got {fixed!r}")
        torch.set_num_threads(threads)
        return ThreadChoice(threads, top, None, f"{ENV}={threads}")
    if top == 1:
        return ThreadChoice(1, 1, None, "one thread to begin with")
    global _LAST
    cores = own_cores()
    if _LAST is not None and time.monotonic() - _LAST[0] < REUSE_S and _LAST[1] == tuple(cores):
        choice = _LAST[2]
    else:
        others = others_cores(sample_s, cores)
        threads = choose_threads(top, len(cores), others)
        reason = ("the machine was quiet" if threads == top else
                  f"other processes were using {others:.1f} of the {len(cores)} cores")
        choice = ThreadChoice(threads, top, others, reason)
        _LAST = (time.monotonic(), tuple(cores), choice)
    torch.set_num_threads(choice.threads)
    return choice
