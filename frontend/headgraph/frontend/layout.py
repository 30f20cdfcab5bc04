"""The page's component tree: model bar, view tabs, controls, one container per view, side panels.

Element ids are stable (tests and screenshots find them): "model-select", "compute-btn",
"progress", "copy-link", "graph", "heatmap", "head-grid", "scatter", "kl-grid", "ref-hist",
"null-fig", "token-grid", "patterns", "head-panel", "pair-panel", "overlay-upload",
"upload-error", and "<view>-summary" text blocks that carry the rendered values.
"""

from __future__ import annotations

from dash import dcc, html

from headgraph.frontend.figures import PAIRING_COLORS
from headgraph.frontend.state import GRAPH_PAIRINGS, PAIRINGS, ROLE_LETTERS, ViewState

VIEW_LABELS: dict[str, str] = {"graph": "Head graph", "heatmap": "Heatmaps", "scatter": "PK vs CS",
                               "reference": "Random reference", "tokens": "Tokens & patterns"}
# Which control groups each view shows.
VIEW_CONTROLS: dict[str, tuple[str, ...]] = {
    "graph": ("pairings", "rule", "metric", "layout", "overlay"),
    "heatmap": ("pairing", "metric", "direction", "overlay"),
    "scatter": ("pairing", "top_percent"),
    "reference": ("pairing",),
    "tokens": ("role",),
}
GRAPH_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2},
                "modeBarButtonsToRemove": ["select2d", "lasso2d"]}
# Figures with PNG / SVG / CSV buttons.
DOWNLOADABLE: tuple[str, ...] = ("graph", "heatmap", "head-grid", "scatter", "kl-grid", "ref-hist",
                                 "null-fig", "token-grid", "patterns", "cosines")


def _group(name: str, label: str, *children: object) -> html.Div:
    return html.Div([html.Label(label, className="ctl-label"), *children],
                    id=f"ctl-{name}", className="ctl-group")


def download_bar(fig_id: str) -> html.Div:
    """PNG / SVG / CSV buttons under a figure and their dcc.Download."""
    return html.Div([
        html.Button("PNG", id=f"dl-{fig_id}-png", className="dl-btn", n_clicks=0),
        html.Button("SVG", id=f"dl-{fig_id}-svg", className="dl-btn", n_clicks=0),
        html.Button("CSV", id=f"dl-{fig_id}-csv", className="dl-btn", n_clicks=0),
        dcc.Download(id=f"dl-{fig_id}"),
        html.Span(id=f"dl-{fig_id}-msg", className="dl-msg"),
    ], className="download-bar")


def figure_block(fig_id: str, *, height: str = "auto") -> html.Div:
    """A dcc.Graph with a loading spinner and its download bar."""
    return html.Div([
        dcc.Loading(dcc.Graph(id=fig_id, config=GRAPH_CONFIG, style={"height": height}),
                    type="dot", delay_show=300),
        download_bar(fig_id),
    ], className="figure-block")


def model_bar() -> html.Div:
    return html.Div([
        html.Div([html.Span("headgraph", className="brand"),
                  html.Span("attention heads read from weights", className="tagline")],
                 className="brand-box"),
        html.Div([
            dcc.Dropdown(id="model-select", options=[ViewState().model], value=ViewState().model, clearable=False,
                         searchable=True, className="model-select", placeholder="model"),
            html.Div(id="model-info", className="model-info"),
            html.Button("Compute", id="compute-btn", className="btn primary", n_clicks=0),
            html.Div([html.Div(id="progress-bar", className="progress-fill", style={"width": "0%"}),
                      html.Span(id="progress-label", className="progress-label")],
                     id="progress", className="progress", style={"display": "none"}),
        ], className="model-controls"),
        html.Div([
            dcc.Input(id="share-url", readOnly=True, value="", className="share-url", debounce=True),
            dcc.Clipboard(id="copy-link", target_id="share-url", title="copy link to this view",
                          className="copy-link"),
        ], className="share-box"),
        html.Div(id="model-message", className="model-message"),
    ], className="model-bar")


def controls() -> html.Div:
    d = ViewState()
    pairing_opts = [{"label": p, "value": p} for p in PAIRINGS]
    return html.Div([
        _group("pairing", "pairing", dcc.Dropdown(id="pairing-select", options=pairing_opts, value=d.pairing,
                                                  clearable=False, className="small-dd")),
        _group("pairings", "edges", dcc.Checklist(
            id="pairings-check", value=list(d.pairings), inline=True, className="pairing-check",
            options=[{"label": html.Span(p, style={"color": PAIRING_COLORS[p], "fontWeight": 600}),
                      "value": p} for p in GRAPH_PAIRINGS])),
        _group("rule", "rule",
               dcc.RadioItems(id="rule-radio", value=d.rule, inline=True,
                              options=[{"label": "top-k", "value": "topk"},
                                       {"label": "threshold", "value": "threshold"}]),
               dcc.Input(id="k-input", type="number", min=1, max=1000, step=1, value=d.k,
                         debounce=True, className="num-input"),
               html.Div(dcc.Slider(id="threshold-slider", min=0, max=1, value=None, step=None,
                                   marks=None, tooltip={"placement": "bottom", "always_visible": True},
                                   updatemode="mouseup"), className="slider-box", id="threshold-box")),
        _group("metric", "metric", dcc.RadioItems(
            id="metric-radio", value=d.metric, inline=True,
            options=[{"label": "raw", "value": "raw"}, {"label": "normalized", "value": "normalized"},
                     {"label": "z", "value": "z"}, {"label": "CS", "value": "cs"}])),
        _group("layout", "layout", dcc.RadioItems(
            id="layout-radio", value=d.layout, inline=True,
            options=[{"label": "layer × head", "value": "grid"}, {"label": "force", "value": "force"}])),
        _group("direction", "head grid", dcc.RadioItems(
            id="direction-radio", value=d.direction, inline=True,
            options=[{"label": "outgoing", "value": "out"}, {"label": "incoming", "value": "in"}])),
        _group("top_percent", "top %", dcc.Input(id="top-percent-input", type="number", min=0.1, max=100,
                                                 step=0.1, value=d.top_percent, debounce=True,
                                                 className="num-input")),
        _group("role", "role", dcc.RadioItems(
            id="role-radio", value=d.role, inline=True,
            options=[{"label": r, "value": r} for r in ROLE_LETTERS])),
        _group("overlay", "classes",
               dcc.Dropdown(id="overlay-select", options=[], value=d.overlay or None,
                            placeholder="no overlay", className="overlay-dd"),
               dcc.Upload(id="overlay-upload", children=html.Span("upload JSON/CSV"),
                          className="upload", multiple=False, accept=".json,.csv,text/csv,application/json"),
               html.Div(id="upload-error", className="upload-error", role="alert")),
    ], className="controls", id="controls")


def views() -> html.Div:
    return html.Div([
        html.Div([html.Div(id="graph-summary", className="summary"), figure_block("graph")],
                 id="view-graph", className="view"),
        html.Div([html.Div(id="heatmap-summary", className="summary"), figure_block("heatmap"),
                  html.Div(id="head-grid-box", children=[
                      html.Div(id="head-grid-summary", className="summary"), figure_block("head-grid")])],
                 id="view-heatmap", className="view"),
        html.Div([html.Div(id="scatter-summary", className="summary"), figure_block("scatter")],
                 id="view-scatter", className="view"),
        html.Div([html.Div(id="reference-summary", className="summary"),
                  html.Div([html.Div(figure_block("kl-grid"), className="col-kl"),
                            html.Div(figure_block("ref-hist"), className="col-hist")], className="row"),
                  figure_block("null-fig")],
                 id="view-reference", className="view"),
        html.Div([html.Div(id="tokens-summary", className="summary"), figure_block("token-grid"),
                  figure_block("patterns")],
                 id="view-tokens", className="view"),
    ], className="views")


def side_panels() -> html.Div:
    return html.Div([
        html.Div([html.Button("×", id="head-close", className="close-btn", n_clicks=0, title="close"),
                  html.Div(id="head-panel-body")],
                 id="head-panel", className="panel", style={"display": "none"}),
        html.Div([html.Button("×", id="pair-close", className="close-btn", n_clicks=0, title="close"),
                  html.Div(id="pair-panel-body"),
                  html.Div(figure_block("cosines"), id="cosines-box")],
                 id="pair-panel", className="panel", style={"display": "none"}),
    ], id="side", className="side")


def build_layout() -> html.Div:
    """The whole page; state comes from the URL, so the initial values are only defaults."""
    return html.Div([
        dcc.Location(id="url", refresh=False),
        dcc.Store(id="models-store"),
        dcc.Store(id="job-store"),
        dcc.Store(id="ready-store"),
        dcc.Store(id="labels-store"),
        dcc.Store(id="uploaded-store"),
        *[dcc.Store(id=f"params-{name}") for name in ("graph", "heatmap", "head-grid", "scatter",
                                                        "reference", "tokens", "head-panel", "pair-panel")],
        dcc.Interval(id="job-poll", interval=400, disabled=True),
        model_bar(),
        dcc.Tabs(id="view-tabs", value=ViewState().view, className="tabs",
                 children=[dcc.Tab(label=label, value=v, id=f"tab-{v}", className="tab",
                                   selected_className="tab-selected")
                           for v, label in VIEW_LABELS.items()]),
        controls(),
        html.Div([views(), side_panels()], className="main"),
        html.Footer([
            "PK(U, U′) = ‖UᵀU′‖²_F between head subspaces (Yamagiwa, Takase & Shimodaira, ",
            html.A("arXiv:2601.10266", href="https://arxiv.org/abs/2601.10266"),
            "); Composition Score (Elhage et al. 2021). API docs: ", html.A("/docs", href="/docs"), "."],
            className="footer"),
    ], className="page")
