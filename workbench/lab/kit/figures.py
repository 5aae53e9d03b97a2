"""Figure styling, and traces addressed by name.

A trace's position in ``fig.data`` is an accident of the order the figure was built in; code that reads or
updates a trace by its index breaks silently when a trace is added above it. Every trace the lab updates or a test
reads carries a unique ``name``, and is found by it.
"""

from __future__ import annotations

import base64
import math
import numbers

import numpy as np
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


# ------------------------------------------------------------------------------------------------ readability
# A subtitle longer than this wraps at its " · " separators: the docs site's column shows about 95 characters.
SUBTITLE_CHARS = 90
LINE_PX = 18
# The legend's top this far below the plotting area: under the x tick labels and the axis title, so rows that
# wrap on a narrow screen grow downwards instead of up into the title.
LEGEND_GAP_PX = 75
TITLE_CHAR_PX = 7.5  # a 14 px axis title's average character width


def readable(fig: go.Figure) -> go.Figure:
    """A copy of ``fig`` as every stored or shown figure should read: log axes labelled with whole numbers at
    1-2-5 steps (or at decades over a wide span) instead of crowded minor digits, text labels drawn past the
    plot edge instead of clipped, a long subtitle wrapped, and the legend below the x-axis title."""
    out = go.Figure(fig)
    for name in _axis_names(out):
        _log_ticks(out, name)
        if name.startswith("yaxis"):
            _wrap_y_title(out, name)
    for item in out.data:
        if item.type == "scatter" and item.mode and "text" in item.mode and item.cliponaxis is None:
            item.cliponaxis = False
    _wrap_subtitle(out)
    _legend_below(out)
    return out


def _axis_names(fig: go.Figure) -> list[str]:
    return [key for key in fig.layout.to_plotly_json() if key[:5] in ("xaxis", "yaxis")]


def _log_ticks(fig: go.Figure, name: str) -> None:
    axis = fig.layout[name]
    if axis.type != "log" or axis.tickvals is not None:
        return
    if axis.dtick is not None:  # the chapter chose the ticks; only spell its minor labels out
        if axis.dtick in ("D1", "D2") and axis.minorloglabels is None:
            axis.minorloglabels = "complete"
        return
    ref, coordinate = name[0] + name[5:], name[0]  # "yaxis2" -> "y2", read from each trace's y
    values = []
    for item in fig.data:
        if (getattr(item, f"{coordinate}axis", None) or coordinate) != ref:
            continue
        for value in _numbers(getattr(item, coordinate, None)):
            if isinstance(value, numbers.Real) and math.isfinite(value) and value > 0:
                values.append(float(value))
    if not values:
        return
    low, high = min(values), max(values)
    span = math.log10(high / low)
    if low >= 1e-4 and high < 1e6 and axis.exponentformat is None:
        axis.exponentformat = "none"  # 0.0005, not 500µ
    if span > 4:
        axis.update(dtick=1, minorloglabels="none")  # decades: 1, 10, 100, ...
    else:
        axis.update(dtick="D2" if span >= 1 else "D1", minorloglabels="complete")  # 0.02, 0.05, 0.1 ...


def _numbers(data) -> list:
    """A trace coordinate as a flat list: plotly's own base64 typed arrays (stored figures) decoded."""
    if data is None:
        return []
    if isinstance(data, dict) and "bdata" in data:
        return np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"]).tolist()
    return list(np.asarray(data, dtype=object).ravel())


def _wrap_y_title(fig: go.Figure, name: str) -> None:
    """Break a y-axis title longer than the plot is high into two lines (ch10's "first step that differs from
    the prompt alone" ran off both ends)."""
    title = fig.layout[name].title
    text = title.text if title else None
    margin = fig.layout.margin
    plot_px = (fig.layout.height or 450) - (margin.t or 100) - (margin.b or 80)
    if not text or "<br>" in text or len(text) * TITLE_CHAR_PX <= plot_px:
        return
    middle = len(text) // 2
    spaces = [i for i, ch in enumerate(text) if ch == " "]
    if spaces:
        cut = min(spaces, key=lambda i: abs(i - middle))
        fig.layout[name].title.text = f"{text[:cut]}<br>{text[cut + 1:]}"


def _wrap_subtitle(fig: go.Figure) -> None:
    title = fig.layout.title
    text = title.subtitle.text if title and title.subtitle else None
    if not text or "<br>" in text or len(text) <= SUBTITLE_CHARS:
        return
    lines, line = [], ""
    for part in text.split(" · "):
        if line and len(line) + 3 + len(part) > SUBTITLE_CHARS:
            lines.append(line)
            line = part
        else:
            line = f"{line} · {part}" if line else part
    lines.append(line)
    fig.layout.title.subtitle.text = "<br>".join(lines)
    if fig.layout.margin.t is not None:
        fig.layout.margin.t += LINE_PX * (len(lines) - 1)


def _legend_below(fig: go.Figure) -> None:
    legend, margin = fig.layout.legend, fig.layout.margin
    if legend.orientation != "h" or legend.y is None or legend.y >= 0 or legend.yanchor != "bottom":
        return
    plot_px = (fig.layout.height or 450) - (margin.t or 100) - (margin.b or 80)
    if plot_px > 0:
        legend.update(yanchor="top", y=-LEGEND_GAP_PX / plot_px)
