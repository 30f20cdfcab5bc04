"""The subgraph view's container (static; callbacks/subgraph.py fills and reads it).

Ids: "subgraph-summary", "subgraph-fig", "sub-query-head" / "sub-query-depth" /
"sub-pin-neighbourhood-btn" and "sub-query-layers" / "sub-query-k" / "sub-pin-layers-btn" (pin
the heads of a server query), "sub-select" (the pinned heads and groups, ticked to
act on), "sub-group-name" / "sub-group-btn", "sub-unpin-btn", "sub-ungroup-btn",
"sub-label-target" / "sub-label-text" / "sub-label-btn", "sub-export-json-btn",
"sub-export-graphml-btn", "sub-download", "sub-import" (a JSON upload), "sub-save-btn" (the
groups as a label set), "sub-msg", "sub-export-msg", "sub-save-msg", and the "sub-action"
store the URL writer reads (one edit per record).
"""

from __future__ import annotations

from typing import Any

from dash import dcc, html

GRAPH_CONFIG: Any = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2},
                     "modeBarButtonsToRemove": ["select2d", "lasso2d"]}
HINT = ("pin heads with Ctrl/⌘/Shift + click on a node of the head graph (or “pin” in a head's panel); "
        "the same click here unpins")


def subgraph_view(style: dict[str, str]) -> html.Div:
    """Pinned heads: the tools (select, group, unpin, label, export, import, save as a label
    set) above the layered subgraph figure."""
    tools = html.Div([
        html.Div([html.Span("pin from the model", className="ctl-label",
                            title="the server picks the heads (GET /api/subgraph): a head's neighbourhood, or a "
                                  "layer range's strongest edges, on the chosen pairings and metric"),
                  dcc.Input(id="sub-query-head", type="text", placeholder="head (e.g. L4H7)", className="text-input",
                            debounce=False, style={"width": "8em"}),
                  html.Span("depth", className="ctl-label"),
                  dcc.Input(id="sub-query-depth", type="number", min=1, max=4, step=1, value=1,
                            className="text-input", style={"width": "4em"}),
                  html.Button("pin neighbourhood", id="sub-pin-neighbourhood-btn", className="btn", n_clicks=0),
                  dcc.Input(id="sub-query-layers", type="text", placeholder="layers (e.g. 10-20)",
                            className="text-input", debounce=False, style={"width": "9em"}),
                  html.Span("top", className="ctl-label"),
                  dcc.Input(id="sub-query-k", type="number", min=1, max=50, step=1, value=10,
                            className="text-input", style={"width": "4em"}),
                  html.Button("pin their heads", id="sub-pin-layers-btn", className="btn", n_clicks=0)],
                 className="sub-row"),
        html.Div([html.Span("pinned", className="ctl-label"),
                  dcc.Checklist(id="sub-select", options=[], value=[], inline=True, className="sub-select")],
                 className="sub-row"),
        html.Div([dcc.Input(id="sub-group-name", type="text", placeholder="group name (e.g. previous-token heads)",
                            className="text-input", debounce=False),
                  html.Button("group ticked", id="sub-group-btn", className="btn", n_clicks=0),
                  html.Button("ungroup ticked", id="sub-ungroup-btn", className="btn", n_clicks=0),
                  html.Button("unpin ticked", id="sub-unpin-btn", className="btn", n_clicks=0)],
                 className="sub-row"),
        html.Div([html.Span("label", className="ctl-label"),
                  dcc.RadioItems(id="sub-label-target", options=[], inline=True, className="sub-select"),
                  dcc.Input(id="sub-label-text", type="text", placeholder="custom label", className="text-input",
                            debounce=False),
                  html.Button("set label", id="sub-label-btn", className="btn", n_clicks=0)],
                 className="sub-row"),
        html.Div([html.Button("export JSON", id="sub-export-json-btn", className="btn", n_clicks=0),
                  html.Button("export GraphML", id="sub-export-graphml-btn", className="btn", n_clicks=0),
                  dcc.Upload(html.Span("import JSON"), id="sub-import", className="upload", multiple=False,
                             accept=".json,application/json"),
                  html.Button("save groups as label set", id="sub-save-btn", className="btn", n_clicks=0,
                              title="every group becomes a class of its heads: a label set (overlay) of "
                                    "this model (in a lab it needs your token)"),
                  dcc.Download(id="sub-download")],
                 className="sub-row"),
        html.Div([html.Span(id="sub-msg", className="verify-msg", role="alert"),
                  html.Span(id="sub-export-msg", className="verify-msg"),
                  html.Span(id="sub-save-msg", className="verify-msg")], className="sub-row"),
    ], id="sub-tools", className="sub-tools")
    return html.Div([
        dcc.Store(id="sub-action"),
        html.P(HINT, className="validation-note"),
        html.Div(id="subgraph-summary", className="summary"),
        tools,
        html.Div(dcc.Loading(dcc.Graph(id="subgraph-fig", config=GRAPH_CONFIG), type="dot", delay_show=300),
                 className="figure-block"),
    ], id="view-subgraph", className="view", style=style)
