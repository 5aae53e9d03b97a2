"""Figure styling, and traces addressed by name.

A trace's position in ``fig.data`` is an accident of the order the figure was built in; code that reads or
updates a trace by its index breaks silently when a trace is added above it. Every trace the lab updates or a test
reads carries a unique ``name``, and is found by it.
"""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.lab.kit.notebook import TEMPLATE


def style(fig: go.Figure, title: str, subtitle: str, *, height: int = 420) -> go.Figure:
    """Title with a subtitle naming what it was measured on; shared margins and legend placement."""
    fig.update_layout(title={"text": title, "subtitle": {"text": subtitle}}, template=TEMPLATE, height=height,
                      margin={"l": 70, "r": 30, "t": 90, "b": 60},
                      legend={"orientation": "h", "yanchor": "bottom", "y": -0.35, "x": 0})
    return fig


def trace_names(fig: go.Figure) -> list[str | None]:
    return [t.name for t in fig.data]


def trace(fig: go.Figure, name: str):
    """The one trace of ``fig`` called ``name``; a clear error when there is none or more than one."""
    found = [t for t in fig.data if t.name == name]
    if len(found) != 1:
        what = "no trace" if not found else f"{len(found)} traces"
        raise KeyError(f"{what} named {name!r} in the figure; its traces: {trace_names(fig)}")
    return found[0]


def set_trace(fig: go.Figure, name: str, **properties) -> None:
    """Update the trace called ``name`` (x=..., y=..., visible=..., any trace property)."""
    trace(fig, name).update(**properties)
