"""The subgraph view's container (static; callbacks/subgraph.py fills and reads it).

Ids: "subgraph-summary", "subgraph-fig", "sub-select" (the pinned heads and groups, ticked to
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
