"""Every stored figure is made readable on its way out (`workbench.lab.kit.figures.readable`, applied by
`workbench.lab.kit.stored.figure_bundle`): log axes labelled with whole numbers instead of crowded minor digits
("8, 7, ... 0.01, 9, 8"), text labels drawn past the plot edge instead of clipped ("t4: top-1 0.879"), a long
subtitle wrapped instead of cut, and a legend that grows downwards, away from the x-axis title."""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.lab.kit.figures import LEGEND_GAP_PX, SUBTITLE_CHARS, readable, style, trace
from workbench.lab.kit.stored import PLOTLY_MIME, figure_bundle


def test_log_axes_get_whole_number_labels_by_their_span():
    fig = go.Figure([go.Bar(x=["a", "b", "c"], y=[0.0105, 0.13, 0.041])])  # ch06's activation errors
    fig.update_yaxes(type="log")
    axis = readable(fig).layout.yaxis
    assert axis.dtick == "D2" and axis.minorloglabels == "complete" and axis.exponentformat == "none"
    narrow = go.Figure(go.Scatter(x=[1, 2], y=[0.007, 0.012], yaxis="y"))
    narrow.update_yaxes(type="log")
    assert readable(narrow).layout.yaxis.dtick == "D1"  # under a decade: every digit, written out
    wide = go.Figure(go.Scatter(x=[0.1, 2000.0], y=[1, 2]))
    wide.update_xaxes(type="log")
    assert readable(wide).layout.xaxis.dtick == 1 and readable(wide).layout.xaxis.minorloglabels == "none"


def test_a_chapter_s_own_ticks_are_kept():
    fig = go.Figure(go.Scatter(x=[1, 10_000], y=[1, 2]))
    fig.update_xaxes(type="log", dtick="D2")
    axis = readable(fig).layout.xaxis
    assert axis.dtick == "D2" and axis.minorloglabels == "complete"
    fig.update_xaxes(tickvals=[1, 100], dtick=None)
    axis = readable(fig).layout.xaxis
    assert axis.dtick is None and axis.minorloglabels is None  # explicit tick values: left as they are


def test_labels_are_not_clipped_and_a_long_subtitle_wraps():
    fig = go.Figure(go.Scatter(name="formats", x=[7200, 11900], y=[0.05, 0.0007], mode="markers+text",
                               text=["int4", "int8"]))
    subtitle = ("measured on 2 replicas x 1 CPU thread(s) · float32 · SmolLM2-135M-Instruct (dequantized Q4_1) · "
                "64 KV blocks of 16 each · vllm-router 0.1.17")
    style(fig, "Hit rate per replica", subtitle)
    out = readable(fig)
    assert trace(out, "formats").cliponaxis is False
    lines = out.layout.title.subtitle.text.split("<br>")
    assert len(lines) == 2 and all(len(line) <= SUBTITLE_CHARS for line in lines)
    assert " · ".join(lines) == subtitle and out.layout.margin.t == fig.layout.margin.t + 18


def test_the_legend_sits_below_the_axis_title_and_grows_down():
    fig = style(go.Figure(go.Scatter(name="a", x=[1], y=[1])), "t", "s", height=420)
    out = readable(fig)
    plot_px = 420 - out.layout.margin.t - out.layout.margin.b
    assert out.layout.legend.yanchor == "top" and out.layout.legend.y == -LEGEND_GAP_PX / plot_px


def test_the_stored_bundle_is_readable_and_the_panel_s_figure_untouched():
    fig = go.Figure(go.Scatter(name="labels", x=[1, 2], y=[0.02, 0.3], mode="text", text=["x", "y"]))
    fig.update_yaxes(type="log")
    spec = figure_bundle(fig, png=False)[PLOTLY_MIME]
    assert spec["layout"]["yaxis"]["dtick"] == "D2"
    assert [t["cliponaxis"] for t in spec["data"] if t["name"] == "labels"] == [False]
    assert fig.layout.yaxis.dtick is None and trace(fig, "labels").cliponaxis is None


def test_a_y_title_longer_than_the_plot_is_high_wraps():
    fig = style(go.Figure(go.Scatter(x=[1, 2], y=[3, 4])), "t", "s", height=420)
    fig.update_yaxes(title_text="first step that differs from the prompt alone")  # ch10's, cut at both ends
    assert readable(fig).layout.yaxis.title.text == "first step that differs<br>from the prompt alone"
    fig.update_yaxes(title_text="step time (ms)")
    assert readable(fig).layout.yaxis.title.text == "step time (ms)"
