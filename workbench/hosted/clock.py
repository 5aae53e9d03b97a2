"""A clock the notebook can move by hand, so five-minute and one-hour TTLs can be shown in seconds."""

from __future__ import annotations


class SimClock:
    """Seconds since the clock was made; ``advance`` moves it forward, never back."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"a clock only moves forward: seconds must be >= 0, got {seconds}")
        self._now += seconds
        return self._now
