"""Progress of a long measurement: the callback type the measurements take (``progress(done, total, text)``),
and the widget that shows it in a panel. The widget imports ipywidgets only when built, so measurement modules
can name the type without loading the notebook stack.

A learner must see within a second that a cell started, even when the measurement reports its first step only a
minute later (a busy machine): ``start()`` lights the bar and its label at once, and a clock beside the label
counts the seconds while the work runs (a background thread: torch releases the interpreter during its kernels,
and the engine's Python loop yields it every few milliseconds). ``end()`` fills the bar in green with the time it
took, ``fail()`` in red; a bar is never left grey and empty after its panel finished.
"""

from __future__ import annotations

import threading
import time

from workbench.progress import ProgressFn, no_progress

__all__ = ["Progress", "ProgressFn", "no_progress"]

TICK_S = 1.0


class Progress:
    """A progress bar and a line of text; measurements call it as ``progress(done, total, text)``."""

    def __init__(self) -> None:
        import ipywidgets as widgets

        self.bar = widgets.IntProgress(value=0, min=0, max=1, layout={"width": "240px"})
        self.label = widgets.Label("")
        self.widget = widgets.HBox([self.bar, self.label])
        self._text = ""
        self._final: str | None = None
        self._started: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # ---- what a measurement calls ----------------------------------------------------------------------------
    def __call__(self, done: int, total: int, text: str = "") -> None:
        self.bar.max = max(total, 1)
        self.bar.value = min(done, self.bar.max)
        if text:
            self._text = text
        self._show()

    def finish(self, text: str) -> None:
        """The measurement's own last word ("12 steps timed"); the panel's ``end()`` adds the time it took."""
        self._final = text
        self.bar.value = self.bar.max
        self._show()

    # ---- what the panel calls --------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._started is not None

    @property
    def elapsed_s(self) -> float:
        return 0.0 if self._started is None else time.monotonic() - self._started

    def start(self, text: str = "measuring") -> None:
        """Show at once that the work started, and keep a clock running beside the label until end/fail."""
        self._stop_ticker()
        self._text, self._final, self._started = text, None, time.monotonic()
        self.bar.bar_style = "info"
        self.bar.max, self.bar.value = 1, 0
        self._show()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="progress-clock", daemon=True)
        self._ticker.start()

    def end(self) -> None:
        """A full green bar and "<last word> · <seconds>"."""
        took = self.elapsed_s
        self._stop_ticker()
        self.bar.value = self.bar.max
        self.bar.bar_style = "success"
        self.label.value = f"{self._final or 'done'} · {took:.1f} s"
        self._started = None

    def fail(self, error: BaseException) -> None:
        took = self.elapsed_s
        self._stop_ticker()
        self.bar.bar_style = "danger"
        reason = "interrupted" if isinstance(error, KeyboardInterrupt) else f"{type(error).__name__}: {error}"
        self.label.value = f"stopped after {took:.1f} s ({reason})"
        self._started = None

    # ---- internals -------------------------------------------------------------------------------------------
    def _show(self) -> None:
        with self._lock:
            if self._final is not None:
                text = self._final
            elif self._started is not None:
                text = f"{self._text or 'measuring'}… {self.elapsed_s:.0f} s"
            else:
                text = self._text
            if self.label.value != text:
                self.label.value = text

    def _tick(self) -> None:
        stop = self._stop
        while not stop.wait(TICK_S):
            self._show()

    def _stop_ticker(self) -> None:
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join(timeout=2 * TICK_S)
        self._ticker = None
