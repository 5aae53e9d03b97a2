"""Progress of a long measurement: the callback type the measurements take (``progress(done, total, text)``),
and the widget that shows it in a panel. The widget imports ipywidgets only when built, so measurement modules
can name the type without loading the notebook stack."""

from __future__ import annotations

from workbench.progress import ProgressFn, no_progress

__all__ = ["Progress", "ProgressFn", "no_progress"]


class Progress:
    """A progress bar and a line of text; measurements call it as ``progress(done, total, text)``."""

    def __init__(self) -> None:
        import ipywidgets as widgets

        self.bar = widgets.IntProgress(value=0, min=0, max=1, layout={"width": "240px"})
        self.label = widgets.Label("")
        self.widget = widgets.HBox([self.bar, self.label])

    def __call__(self, done: int, total: int, text: str = "") -> None:
        self.bar.max = max(total, 1)
        self.bar.value = min(done, self.bar.max)
        self.label.value = text

    def finish(self, text: str) -> None:
        self.bar.value = self.bar.max
        self.label.value = text
