"""Helpers of the closing-table tests: a verdict that its results cannot change is a defect."""

from __future__ import annotations


def rows_that_never_turn(*tables) -> list[int]:
    """Rows (1-based) whose verdict is the same in every table: closing tables built from results that agree
    with the seed and from results that contradict it. A row listed here is a verdict its results cannot change."""
    verdicts = [t.verdicts for t in tables]
    return [i + 1 for i in range(len(verdicts[0])) if len({v[i] for v in verdicts}) == 1]
