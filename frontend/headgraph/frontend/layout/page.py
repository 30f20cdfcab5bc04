"""The page's component tree: model bar, view tabs, controls, one container per view, side panels.

Element ids are stable (tests and screenshots find them): "model-select", "compute-btn",
"progress", "copy-link", "graph", "heatmap", "head-grid", "scatter", "kl-grid", "ref-hist",
"null-fig", "token-grid", "patterns", "validation", "validation-scatter", "head-panel",
"pair-panel", "overlay-upload", "upload-error", "recovery", "recovery-body", "task-curve", "task-graph", "task-body",
"task-progress",
"tab-<view>", and "<view>-summary"
text blocks that carry the rendered values.
The tabs, the model dropdown and the controls are placeholders here: ``render_controls``
builds them from the URL (controls.py).
"""

from __future__ import annotations

from typing import Any

from dash import dcc, html

from headgraph.frontend.layout.compare import compare_view, timeline_view
from headgraph.frontend.layout.controls import control_groups, model_picker, tab_links
from headgraph.frontend.layout.subgraph import subgraph_view
from headgraph.frontend.state.readiness import ROUTED_PARTS, ROUTED_VIEWS

GRAPH_CONFIG: dcc.Graph.Config = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2},
                                  "modeBarButtonsToRemove": ["select2d", "lasso2d"]}
# Figures with PNG / SVG / CSV buttons.
DOWNLOADABLE: tuple[str, ...] = ("graph", "heatmap", "head-grid", "scatter", "kl-grid", "ref-hist",
                                 "null-fig", "token-grid", "patterns", "cosines", "validation", "validation-scatter",
                                 "recovery")

# Figures whose view filters its data: CSV is what the view shows, "CSV (all)" the whole answer.
FILTERED: tuple[str, ...] = ("graph",)


def download_bar(fig_id: str) -> html.Div:
    """PNG / SVG / CSV buttons under a figure (and "CSV (all)" under a filtered one) and their
    dcc.Download."""
    full = [html.Button("CSV (all)", id=f"dl-{fig_id}-csvall", className="dl-btn", n_clicks=0,
                        title="every edge of the API's answer, before the view's filters")
            ] if fig_id in FILTERED else []
    return html.Div([
        html.Button("PNG", id=f"dl-{fig_id}-png", className="dl-btn", n_clicks=0),
        html.Button("SVG", id=f"dl-{fig_id}-svg", className="dl-btn", n_clicks=0),
        html.Button("CSV", id=f"dl-{fig_id}-csv", className="dl-btn", n_clicks=0,
                    title="the data the view shows"),
        *full,
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


def model_bar(auth: tuple[str, str] | None = None) -> html.Div:
    return html.Div([
        html.Div([html.Span("headgraph", className="brand"),
                  html.Span("attention heads read from weights", className="tagline")],
                 className="brand-box"),
        html.Div([
            html.Div(model_picker(None, None), id="model-select-box", className="model-picker"),
            html.Div(id="model-info", className="model-info"),
            html.Button("Compute", id="compute-btn", className="btn primary", n_clicks=0),
            html.Div([html.Div(id="progress-bar", className="progress-fill", style={"width": "0%"}),
                      html.Span(id="progress-label", className="progress-label")],
                     id="progress", className="progress", style={"display": "none"}),
            html.Div(id="queue-note", className="queue-note", style={"display": "none"}),
        ], className="model-controls"),
        html.Div([
            dcc.Input(id="share-url", readOnly=True, value="", className="share-url", debounce=True),
            dcc.Clipboard(id="copy-link", target_id="share-url", title="copy link to this view",
                          className="copy-link"),
        ], className="share-box"),
        sign_in_box(auth),
        html.Div(id="model-message", className="model-message"),
    ], className="model-bar")


def sign_in_box(auth: tuple[str, str] | None = None) -> html.Div:
    """The user's own API token, kept in their browser (callbacks/auth.py); ``auth``: the
    status text and box class the page opens with (callbacks/auth.py ``auth_view``)."""
    text, box = auth or ("", "signin-box")
    return html.Div([
        dcc.Input(id="token-input", type="password", placeholder="API token", value="",
                  autoComplete="current-password", className="token-input", n_submit=0),
        html.Button("Sign in", id="signin-btn", className="btn", n_clicks=0),
        html.Button("Sign out", id="signout-btn", className="btn", n_clicks=0),
        html.Span(text, id="signin-status", className="signin-status"),
    ], id="signin-box", className=box)


def controls() -> html.Div:
    """The control bar: URL-built groups, then the (static) overlay upload and its message."""
    return html.Div([
        html.Div(control_groups(None, None), id="controls-dynamic", className="controls-dynamic"),
        html.Div([dcc.Upload(id="overlay-upload", children=html.Span("upload JSON/CSV"), className="upload",
                             multiple=False, accept=".json,.csv,text/csv,application/json"),
                  html.Div(id="upload-error", className="upload-error", role="alert")],
                 id="ctl-upload", className="ctl-group", style={"display": "none"}),
    ], className="controls", id="controls")


def view_style(view: str, shown: str | None) -> dict[str, str]:
    """A view container's style at mount: only the link's own view is displayed (the others'
    figures then wait unplotted, assets/deferred-plots.js); the URL's callback
    (navigation.show_page) owns it afterwards. ``shown`` None: none yet."""
    return {"display": "block" if view == shown else "none"}


def views(shown: str | None = None) -> html.Div:
    return html.Div([
        html.Div([verify_top_box(), html.Div(id="graph-summary", className="summary"), figure_block("graph")],
                 id="view-graph", className="view", style=view_style("graph", shown)),
        html.Div([html.Div(id="heatmap-summary", className="summary"), figure_block("heatmap"),
                  html.Div(id="head-grid-box", children=[
                      html.Div(id="head-grid-summary", className="summary"), figure_block("head-grid")])],
                 id="view-heatmap", className="view", style=view_style("heatmap", shown)),
        html.Div([html.Div(id="scatter-summary", className="summary"), figure_block("scatter")],
                 id="view-scatter", className="view", style=view_style("scatter", shown)),
        html.Div([html.Div(id="reference-summary", className="summary"),
                  html.Div([html.Div(figure_block("kl-grid"), className="col-kl"),
                            html.Div(figure_block("ref-hist"), className="col-hist")], className="row"),
                  figure_block("null-fig")],
                 id="view-reference", className="view", style=view_style("reference", shown)),
        html.Div([html.Div(id="tokens-summary", className="summary"), figure_block("token-grid"),
                  figure_block("patterns")],
                 id="view-tokens", className="view", style=view_style("tokens", shown)),
        html.Div([html.Div(id="validation-summary", className="summary"),
                  html.Div(id="validation-words", className="validation-words"), validation_run_box(),
                  figure_block("validation"),
                  html.Div(figure_block("validation-scatter"), id="validation-scatter-box", style={"display": "none"})],
                 id="view-validation", className="view", style=view_style("validation", shown)),
        html.Div([html.Div(id="recovery-summary", className="summary"),
                  html.Div(id="recovery-body", className="validation-words"), figure_block("recovery")],
                 id="view-recovery", className="view", style=view_style("recovery", shown)),
        html.Div([html.P("A task's circuit is computed on request: a cold one (attribution, the faithfulness "
                         "curve, patched edges) takes a minute or more on a real model.", className="validation-note"),
                  html.Div([dcc.Upload(html.Span(["upload a task (JSONL: ",
                                                  html.Code('{"clean", "corrupt", "answer", "distractor"}'),
                                                  " a line; its name is the file's)"]),
                                        id="task-upload", className="upload", multiple=False,
                                        accept=".jsonl,.ndjson,.json,.txt,application/x-ndjson"),
                            html.Div(id="task-upload-msg", className="upload-error", role="alert")],
                           id="task-upload-box"),
                  # A cold circuit's stage and fraction (GET /api/circuit/progress, polled).
                  html.Div([html.Div(id="task-progress-bar", className="progress-fill", style={"width": "0%"}),
                            html.Span(id="task-progress-label", className="progress-label")],
                           id="task-progress", className="progress task-progress", style={"display": "none"}),
                  dcc.Interval(id="task-poll", interval=1000, disabled=True),
                  dcc.Loading([html.Div(id="task-summary", className="summary"),
                               html.Div(id="task-body", className="validation-words"),
                               dcc.Graph(id="task-graph", config=GRAPH_CONFIG),
                               dcc.Graph(id="task-curve", config=GRAPH_CONFIG)],
                              id="task-loading", type="circle", delay_show=300)],
                 id="view-task", className="view", style=view_style("task", shown)),
        compare_view(view_style("compare", shown)),
        timeline_view(view_style("timeline", shown)),
        subgraph_view(view_style("subgraph", shown)),
    ], className="views")


def validation_run_box() -> html.Div:
    """The validation view's "run validation" button (shown while not computed,
    callbacks/validation.py), its running note with the seconds so far, and its message."""
    return html.Div([
        html.Div([html.Button("run validation", id="validation-run-btn", className="btn primary", n_clicks=0,
                              title="measure a random sample of forward pairs and each metric's top-k by path "
                                    "ablation (computes; in a lab it needs your token)"),
                  html.Span([html.Span(className="running-dot"),
                             "running: measuring the sampled pairs by path ablation on both prompt sets "
                             "(minutes on a real model)… ", html.Span(id="validation-elapsed")],
                            id="validation-running", className="verify-msg", style={"display": "none"})],
                 id="validation-run-box", className="verify-box", style={"display": "none"}),
        html.Span(id="validation-run-msg", className="verify-msg"),
        dcc.Store(id="validation-token"),  # changes when the page computed a validation
        dcc.Store(id="validation-started"),
        dcc.Interval(id="validation-tick", interval=1000, disabled=True),
    ])


def verify_top_box() -> html.Div:
    """The graph's "verify the top edges" button (shown while verification is on,
    callbacks/verify.py) and its message."""
    return html.Div([html.Button("verify the top edges", id="verify-top-btn", className="btn", n_clicks=0,
                                 title="measure the top edges by PK of each shown pairing by path ablation "
                                       "(computes; in a lab it needs your token)"),
                     html.Div([html.Div(id="verify-top-bar", className="progress-fill", style={"width": "0%"}),
                               html.Span(id="verify-top-label", className="progress-label")],
                              id="verify-top-progress", className="progress", style={"display": "none"}),
                     html.Span(id="verify-top-msg", className="verify-msg"),
                     dcc.Store(id="verify-top-queue"),
                     # fires once per measured pairing: each step re-arms it (max_intervals)
                     dcc.Interval(id="verify-top-tick", interval=50, max_intervals=0)],
                    id="verify-top-box", className="verify-box", style={"display": "none"})


def pair_ablation_box() -> html.Div:
    """The pair panel's path-ablation verdict (read from the cache) and its verify button."""
    return html.Div([html.Div(id="pair-ablation"),
                     html.Button("verify by ablation", id="verify-edge-btn", className="btn", n_clicks=0,
                                 style={"display": "none"},
                                 title="measure this edge by path ablation (computes; in a lab it needs your token)"),
                     html.Div(html.Span("measuring this edge: forward passes on text and on repeated random "
                                        "tokens…", className="progress-label"),
                              id="verify-edge-progress", className="progress indeterminate",
                              style={"display": "none"}),
                     html.Span(id="verify-edge-msg", className="verify-msg")],
                    id="pair-ablation-box", className="pair-ablation")


def side_panels() -> html.Div:
    return html.Div([
        html.Div([html.Div(id="head-panel-body")],
                 id="head-panel", className="panel", style={"display": "none"}),
        html.Div([html.Div(id="pair-panel-body"), pair_ablation_box(),
                  html.Div(figure_block("cosines"), id="cosines-box")],
                 id="pair-panel", className="panel", style={"display": "none"}),
    ], id="side", className="side")


def build_layout(labels: Any = None, ready: Any = None, view: str | None = None,
                 auth: tuple[str, str] | None = None) -> html.Div:
    """The whole page; state comes from the URL, so the initial values are only defaults.

    ``labels`` (the API's label sets) and ``ready`` (the ready record of the model the page's
    link names, when it is fully cached) come with the layout when the app knows them
    (callbacks/model.py ``page_data``), so a warm view need not wait for a first callback;
    ``view``, the view that link opens, is the one displayed at mount; ``auth``, the sign-in
    status of this browser.
    """
    return html.Div([
        dcc.Location(id="url", refresh=False),
        dcc.Store(id="models-store"),
        dcc.Store(id="job-store"),
        dcc.Store(id="ready-store"),
        dcc.Store(id="labels-store", data=labels),
        dcc.Store(id="ready-initial", data=ready),
        dcc.Store(id="uploaded-store"),
        dcc.Store(id="slider-range"),
        dcc.Store(id="auth-store"),
        dcc.Store(id="ablation-token"),  # changes when the page measured edges (callbacks/verify.py)
        dcc.Interval(id="job-poll", interval=700, disabled=True),
        dcc.Interval(id="queue-poll", interval=2500),  # callbacks/queue.py
        *[dcc.Store(id=f"in-{v}-{part}") for v in ROUTED_VIEWS for part in ROUTED_PARTS],  # callbacks/router.py
        model_bar(auth),
        html.Nav(tab_links(None), id="view-tabs", className="tabs"),
        controls(),
        html.Div([views(view), side_panels()], className="main"),
        html.Footer([
            "PK(U, U′) = ‖UᵀU′‖²_F between head subspaces (Yamagiwa, Takase & Shimodaira, ",
            html.A("arXiv:2601.10266", href="https://arxiv.org/abs/2601.10266"),
            "); Composition Score (Elhage et al. 2021). API docs: ", html.A("/docs", href="/docs"), "."],
            className="footer"),
    ], className="page")
