"""Whether the machine was busy while a measurement ran, so that a timing taken on a shared machine is reported
as "the machine was busy: not measurable now, re-run" instead of being read as a fact about the engine.

On a 2-core laptop a second busy process (a neighbour's notebook, ``workbench serve``, the browser) takes a core,
and a timing taken then says more about the neighbour than about the engine: a newcomer's run of chapter 2 drew
the cached decode *slower* than recomputing everything, and its closing table called the KV cache "wrong"
(benchmarks/RESULTS.md, "A busy machine": what one busy process does to torch at 1 and 2 threads).

Two signals, either one enough:

- **waiting for a CPU**: Linux keeps, for every thread, the time it ran and the time it was ready to run but
  waited for a CPU (`workbench.schedstat`). ``watch()`` reads those books around a measurement; when
  this process's threads spent more than ``WAIT_LIMIT`` of their runnable time waiting, other work held the
  cores. On a quiet machine the share is 0-4%; beside one busy loop on a shared core it is a third to a half.
  It counts only while other processes kept the cores busy (``OTHERS_LIMIT``, read from /proc/stat less this
  process's own CPU time): a server, its engine thread and its clients in one kernel also queue behind each other,
  and that is the workload being measured, not a neighbour (chapter 8's dashboard waited 29% that way, alone).
- **the same work timed twice disagreeing**: two runs of identical work (the same prompt's prefill in both arms
  of a comparison, repeats of one step) that differ by more than ``AGREEMENT`` times. Quiet repeats of one shape
  agree within about 10% (`workbench.lab.kit.evidence.TIMING_FLOOR`); the busy run above had 1,621 against
  4,918 ms.

Every panel records ``Contention`` for its last measurement (``LabPanel.contention``); a verdict reads it through
``busy_takeaway`` (or ``Contention.busy`` and ``.note``) and says the machine was busy instead of concluding.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from workbench.schedstat import read_books, spent

if TYPE_CHECKING:
    from workbench.lab.kit.closing import Takeaway

# Share of this process's runnable time spent waiting for a CPU above which the run counts as contended.
# Measured on the project's 2-core machine (benchmarks/RESULTS.md, "A busy machine"): 0-4% with the cores it needs
# free; 34% at 2 threads beside one busy loop (decode 3.1x slower); 66-88% with other jobs on the machine.
WAIT_LIMIT = 0.25
# Two timings of the same work further apart than this ratio: something else took the machine in between.
AGREEMENT = 1.5
# Below this much runnable time the books are too short to judge (a sub-second panel redraw).
MIN_RUNNABLE_S = 0.05
# Other processes using less than this many cores on average leave the cores to this one: waiting for a CPU is
# then this process's own threads queueing behind each other (a server, its engine thread and its clients in one
# kernel, as chapter 8 runs them), which is the workload, not a neighbour.
OTHERS_LIMIT = 0.3
BUSY = "the machine was busy: not measurable now, re-run"


@dataclass(frozen=True, slots=True)
class Contention:
    """How contended one measurement was. ``run_s``/``wait_s``: this process's threads' CPU time and time spent
    ready but waiting for a CPU (None without the kernel's books); ``pairs``: timings of identical work, as
    (what, seconds, seconds)."""

    wall_s: float
    run_s: float | None = None
    wait_s: float | None = None
    pairs: tuple[tuple[str, float, float], ...] = field(default_factory=tuple)
    others_cores: float | None = None  # cores other processes kept busy on average (None: not known)

    @property
    def wait_share(self) -> float | None:
        """Share of the runnable time spent waiting for a CPU (None when unknown or too short to judge)."""
        if self.run_s is None or self.wait_s is None or self.run_s + self.wait_s < MIN_RUNNABLE_S:
            return None
        return self.wait_s / (self.run_s + self.wait_s)

    def disagreements(self) -> list[tuple[str, float]]:
        """Each pair of same-work timings further apart than AGREEMENT, with its ratio (larger over smaller)."""
        out = []
        for what, a, b in self.pairs:
            low, high = sorted((a, b))
            ratio = high / low if low > 0 else float("inf")
            if ratio > AGREEMENT:
                out.append((what, ratio))
        return out

    @property
    def waited_on_others(self) -> bool:
        """This process waited for a CPU more than WAIT_LIMIT of its runnable time while other processes used the
        cores (or their use is unknown)."""
        share = self.wait_share
        neighbours = self.others_cores is None or self.others_cores >= OTHERS_LIMIT
        return share is not None and share > WAIT_LIMIT and neighbours

    @property
    def busy(self) -> bool:
        return self.waited_on_others or bool(self.disagreements())

    def reasons(self) -> list[str]:
        """What showed the contention, in words a learner can check."""
        out = []
        share = self.wait_share
        if self.waited_on_others:
            others = "" if self.others_cores is None else f", while other processes kept {self.others_cores:.1f} " \
                                                           "cores busy"
            out.append(f"this kernel's threads waited for a CPU {share:.0%} of the time they were ready to run "
                       f"({self.wait_s:.1f} s of {self.run_s + self.wait_s:.1f} s{others})")
        out += [f"{what} took {ratio:.1f}x longer one time than the other" for what, ratio in self.disagreements()]
        return out

    def note(self) -> str:
        """The verdict's note when busy: "the machine was busy: not measurable now, re-run (...why...)"."""
        return f"{BUSY} ({'; '.join(self.reasons())})" if self.busy else ""

    def same_work(self, what: str, first_s: float, second_s: float) -> Contention:
        """This reading with one more pair of timings of identical work (e.g. the same prefill in both arms)."""
        if first_s < 0 or second_s < 0:
            raise ValueError(f"timings must be >= 0 s, got {first_s} and {second_s} for {what!r}")
        return replace(self, pairs=(*self.pairs, (what, float(first_s), float(second_s))))

    def status_html(self) -> str:
        """A warning for a panel's status line, or "" when the machine was quiet enough."""
        if not self.busy:
            return ""
        return (f"<br><span class='wb-busy' style='color:#b45309'>&#9888; {BUSY}: {'; '.join(self.reasons())}. "
                "The timings above measure the neighbours as much as the engine.</span>")


class Watch:
    """What ``watch()`` yields: ``contention`` is set when the block ends."""

    def __init__(self) -> None:
        self.contention: Contention | None = None


@contextmanager
def watch() -> Iterator[Watch]:
    """Read the kernel's books around a block: ``with watch() as w: measure()``, then ``w.contention``."""
    from workbench.lab.kit.threads import OthersMeter

    handle = Watch()
    before, others, start = read_books(), OthersMeter(), time.perf_counter()
    try:
        yield handle
    finally:
        wall = time.perf_counter() - start
        after, neighbours = read_books(), others.cores_used()
        if before is None or after is None:
            handle.contention = Contention(wall, others_cores=neighbours)
        else:
            run, wait = spent(before, after)
            handle.contention = Contention(wall, run, wait, others_cores=neighbours)


def from_timings(what: str, timings: Sequence[float]) -> Contention:
    """A reading from timings of identical work alone (no kernel books): every timing against the fastest."""
    values = [float(t) for t in timings]
    if len(values) < 2:
        raise ValueError(f"same_work needs at least two timings of {what!r}, got {len(values)}")
    fastest = min(values)
    reading = Contention(wall_s=sum(values))
    return reading.same_work(what, fastest, max(values))


def busy_takeaway(row: Takeaway, *contentions: Contention | None) -> Takeaway:
    """The closing-table row as it stands on a quiet machine; on a busy one, the same claim and measurement with
    the verdict "not measurable here" and the note "the machine was busy: not measurable now, re-run (why)".

    ``contentions``: the readings of every measurement the row's timings come from (a row comparing two runs of
    a panel passes both); the first busy one decides, None (not measured, or no books) counts as quiet."""
    busy = next((c for c in contentions if c is not None and c.busy), None)
    if busy is None:
        return row
    from workbench.lab.kit.closing import Verdict

    return replace(row, verdict=Verdict.NOT_MEASURABLE, note=busy.note())
