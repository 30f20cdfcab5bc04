"""The compare and timeline views' containers (static; callbacks/compare.py fills them).

Ids: "compare-summary", "compare-heatmaps", "compare-graph", "compare-tables",
"compare-model-list" (the A / B inputs' suggestions), "timeline-summary", "step-slider" (in
"step-slider-box"),
"timeline", "timeline-grid", "timeline-csv-btn", "timeline-download", "series-list".
"""

from __future__ import annotations

from typing import Any

from dash import dcc, html

GRAPH_CONFIG: Any = {"displaylogo": False, "modeBarButtonsToRemove": ["select2d", "lasso2d"]}


def _figure(fig_id: str) -> html.Div:
    return html.Div(dcc.Loading(dcc.Graph(id=fig_id, config=GRAPH_CONFIG), type="dot", delay_show=300),
                    className="figure-block")


def compare_view(style: dict[str, str]) -> html.Div:
    """Model A vs model B: summary chips, A | B | B - A heatmaps, the edge-change graph, tables."""
    return html.Div([
        html.Datalist(id="compare-model-list"),
        html.Div(id="compare-summary", className="summary"),
        _figure("compare-heatmaps"),
        _figure("compare-graph"),
        html.Div(id="compare-tables", className="compare-tables"),
    ], id="view-compare", className="view", style=style)


def step_slider(steps: list[Any] | None = None, value: int | None = None) -> dcc.Slider:
    """The checkpoint slider: one mark per step of the series (index -> step), at ``value``.

    The timeline callback returns a new one inside "step-slider-box" rather than writing its
    ``value``: a callback writing the value would put the URL writer (which reads it) downstream
    of every view, and Dash would then hold each URL-driven callback of a page load back until
    another had answered (dash-renderer's ``getReadyCallbacks`` follows outputs to inputs)."""
    marks = {i: str(s) for i, s in enumerate(steps)} if steps else None
    return dcc.Slider(id="step-slider", min=0, max=max(len(steps or []) - 1, 1), step=None, value=value,
                      marks=marks, updatemode="mouseup")


def timeline_view(style: dict[str, str]) -> html.Div:
    """A series of checkpoints: a step slider, per-edge trajectories, the shown step's grid."""
    return html.Div([
        html.Datalist(id="series-list"),
        html.Div(id="timeline-summary", className="summary"),
        html.Div([html.Span("checkpoint", className="ctl-label"),
                  html.Div(step_slider(), id="step-slider-box", className="slider-box",
                           style={"width": "min(640px, 70vw)"})],
                 id="step-box", className="ctl-group"),
        _figure("timeline"),
        _figure("timeline-grid"),
        html.Div([html.Button("download trajectories (CSV)", id="timeline-csv-btn", className="btn",
                              n_clicks=0),
                  dcc.Download(id="timeline-download")], className="download-bar"),
    ], id="view-timeline", className="view", style=style)
