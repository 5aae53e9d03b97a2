"""The progress callback every long measurement takes, ``progress(done, total, text)``: engine-side, so that
measurements outside the lab (``workbench.quality``, ``workbench.spec_experiments``, ``workbench.bench``) and the
lab's progress widget (`workbench.lab.kit.progress`) share one definition."""

from __future__ import annotations

from collections.abc import Callable

ProgressFn = Callable[[int, int, str], None]


def no_progress(done: int, total: int, text: str = "") -> None:
    """The progress callback of a measurement nobody watches."""
