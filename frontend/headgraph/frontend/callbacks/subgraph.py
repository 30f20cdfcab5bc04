"""Subgraph view: the pinned heads (the URL's ``pins``) and the edges among them for every chosen
pairing on the metric switch (GET /api/subgraph, at most SUB_CAP edges), their groups drawn as
one node with aggregated edges and their custom labels (figures.subgraph), on a layered layout.

Every edit (group, ungroup, unpin, label, a JSON import, a modifier-click pin from
assets/pin-click.js) is one record in the ``sub-action`` store, which the URL writer turns into
the next URL (state.transitions.apply_subgraph_action): pins, groups and labels live in the
link. Exports (JSON, GraphML) and "save groups as a label set" (POST /api/labels, then the new
set is the overlay) read the URL's state and the API; nothing here keeps state of its own.
"""

from __future__ import annotations

import json
import time
from typing import Any

from dash import Input, Output, State, ctx, html, no_update

from headgraph.frontend.api.answers import SubgraphOut
from headgraph.frontend.api.client import ApiClient, ApiError
from headgraph.frontend.callbacks.common import (
    api,
    class_order,
    error_note,
    overlay_classes,
    stat,
    state_of,
    vocab,
)
from headgraph.frontend.callbacks.define import callback
from headgraph.frontend.callbacks.labels import decode_upload
from headgraph.frontend.callbacks.router import view_callback
from headgraph.frontend.figures import empty_figure
from headgraph.frontend.figures.subgraph import (
    AGGREGATION,
    GROUP_PREFIX,
    METRIC_WORDS,
    SubgraphImportError,
    aggregate,
    export_graphml,
    export_record,
    label_set_body,
    parse_import,
    rank_on,
    subgraph_figure,
)
from headgraph.frontend.state.readiness import view_params, waiting_for
from headgraph.frontend.state.url import ViewState

SUB_CAP = 500  # edges one subgraph view asks for (the API's default cap is lower)
NO_PINS = ("no pinned heads yet: Ctrl/⌘/Shift + click a node of the head graph (or “pin” in a head's "
           "panel) to pin it here")


def load_subgraph(client: ApiClient, state: ViewState | dict[str, Any]) -> tuple[SubgraphOut, dict[str, Any]]:
    """(the API's answer for the pinned heads, the drawn node-link with groups and labels)."""
    d = state.to_dict() if isinstance(state, ViewState) else state
    groups = [(str(n), [str(h) for h in m]) for n, m in d["groups"]]
    labels = {str(k): str(v) for k, v in d["labels"]}
    answer = client.subgraph(d["model"], heads=list(d["pins"]), pairings=list(d["pairings"]),
                             rank_on=rank_on(d["metric"]), cap=SUB_CAP)
    classes = overlay_classes(client, d.get("overlay"), d["model"])
    return answer, aggregate(answer, groups, labels, classes)


def options_of(state_pins: list[str], groups: list[Any], labels: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the tick list: groups, then pins outside a group; the label target list: pins and groups)."""
    label = {str(k): str(v) for k, v in labels}
    grouped = {h for _, m in groups for h in m}
    ticks = [{"label": f"{label.get(n, n)} [{', '.join(m)}]", "value": GROUP_PREFIX + str(n)} for n, m in groups]
    ticks += [{"label": label.get(h, h), "value": h} for h in state_pins if h not in grouped]
    targets = [{"label": f"{h}" + (f" ({label[h]})" if h in label else ""), "value": h} for h in state_pins]
    targets += [{"label": f"group {n}" + (f" ({label[n]})" if n in label else ""), "value": GROUP_PREFIX + str(n)}
                for n, _ in groups]
    return ticks, targets


@view_callback("subgraph", Output("subgraph-fig", "figure"), Output("subgraph-summary", "children"),
               Output("sub-select", "options"), Output("sub-label-target", "options"))
def render_subgraph(search: str | None, ready: dict | None, label_sets: list | None) -> tuple:
    """The pinned heads' subgraph of the URL's model, pairings, metric, overlay, groups and labels."""
    state = state_of(search, label_sets)
    params = view_params(state, "subgraph", ready)
    if not params:
        return empty_figure(waiting_for(state, ready, "subgraph")), [], no_update, no_update
    ticks, targets = options_of(params["pins"], params["groups"], params["labels"])
    if not params["pins"]:
        return empty_figure(NO_PINS), [html.Span(NO_PINS, className="hint", id="sub-empty")], ticks, targets
    if not params["pairings"]:
        return empty_figure("pick at least one pairing (OQ / OK / OV) above"), [], ticks, targets
    client = api()
    try:
        answer, drawn = load_subgraph(client, params)
    except ApiError as err:
        return empty_figure(err.message), [error_note(err.message)], ticks, targets
    on = rank_on(params["metric"])
    fig = subgraph_figure(drawn, rank_on_=on, class_order=class_order(client, params.get("overlay"), label_sets),
                          title=f"Subgraph · {answer.get('rule', '')}")
    return fig, summary(answer, drawn, on), ticks, targets


def summary(answer: SubgraphOut, drawn: dict[str, Any], on: str) -> list[Any]:
    """Chips: drawn nodes and edges, the API's edges (and what its cap left out), the rule and
    the aggregation; ``data-nodes`` / ``data-edges`` carry the drawn ids and labels for tests."""
    nodes = {str(n["id"]): str(n["label"]) for n in drawn["nodes"]}
    edges = [[e["source"], e["target"], e["pairing"], e["value"], e["count"]] for e in drawn["edges"]]
    data: dict[str, Any] = {"data-nodes": json.dumps(nodes, sort_keys=True), "data-edges": json.dumps(edges)}
    parts: list[Any] = [
        stat("nodes", len(nodes), "sub-nodes"), stat("edges drawn", len(drawn["edges"]), "sub-edges"),
        stat("pair edges", answer.get("total"), "sub-total"),
        html.Span(answer.get("rule", ""), className="rule-text", id="sub-rule"),
        html.Span(f"groups: {AGGREGATION} ({METRIC_WORDS.get(on, on)})", className="hint", id="sub-aggregation"),
        html.Span("", id="sub-drawn", style={"display": "none"}, **data),
    ]
    if answer.get("left_out"):
        parts.append(html.Span(f"{answer['left_out']} weaker edges left out ({answer.get('hint')})",
                               className="hint warn", id="sub-left-out"))
    return parts


@callback(Output("sub-action", "data"), Output("sub-msg", "children"),
          Input("sub-group-btn", "n_clicks"), Input("sub-ungroup-btn", "n_clicks"),
          Input("sub-unpin-btn", "n_clicks"), Input("sub-label-btn", "n_clicks"),
          State("sub-select", "value"), State("sub-group-name", "value"), State("sub-label-target", "value"),
          State("sub-label-text", "value"), prevent_initial_call=True)
def edit_subgraph(_g: Any, _u: Any, _p: Any, _l: Any, ticked: list[str] | None, name: str | None,
                  target: str | None, text: str | None) -> tuple[Any, Any]:
    """A button's edit as one ``sub-action`` record (the URL writer applies it)."""
    ticked = list(ticked or [])
    heads = [t for t in ticked if not t.startswith(GROUP_PREFIX)]
    groups = [t[len(GROUP_PREFIX):] for t in ticked if t.startswith(GROUP_PREFIX)]
    which = ctx.triggered_id
    stamp = time.time()
    if which == "sub-group-btn":
        if not (name or "").strip() or len(heads) < 1:
            return no_update, "tick the heads to group and give the group a name"
        return {"op": "group", "name": name, "heads": heads, "t": stamp}, f"grouped {len(heads)} heads as {name}"
    if which == "sub-ungroup-btn":
        return ({"op": "ungroup", "names": groups, "t": stamp}, "") if groups else (no_update, "tick a group")
    if which == "sub-unpin-btn":
        if not ticked:
            return no_update, "tick the heads (or groups) to unpin"
        return {"op": "unpin", "heads": heads + groups, "t": stamp}, ""
    if which == "sub-label-btn":
        if not target:
            return no_update, "pick the head or group to label"
        key = target[len(GROUP_PREFIX):] if target.startswith(GROUP_PREFIX) else target
        return {"op": "label", "key": key, "text": text or "", "t": stamp}, ""
    return no_update, no_update


QUERY_K_MAX = 50  # edges a "pin their heads" query keeps (a pin list stays readable)


def query_heads(answer: SubgraphOut) -> list[str]:
    """The query heads of a subgraph answer's edges, strongest edge first (a KV group counts as
    the query heads it serves, which are what a pin names)."""
    members = {str(n["name"]): [str(h) for h in n.get("heads") or [n["name"]]] for n in answer.get("nodes", [])}
    out: list[str] = []
    for e in sorted(answer.get("edges", []), key=lambda e: e.get("rank", 0)):
        for end in (e["source"], e["target"]):
            out += members.get(str(end), [str(end)])
    if not out and answer.get("params", {}).get("head"):
        out.append(str(answer["params"]["head"]))
    return list(dict.fromkeys(out))


@callback(Output("sub-action", "data", allow_duplicate=True), Output("sub-msg", "children", allow_duplicate=True),
          Input("sub-pin-neighbourhood-btn", "n_clicks"), Input("sub-pin-layers-btn", "n_clicks"),
          State("sub-query-head", "value"), State("sub-query-depth", "value"),
          State("sub-query-layers", "value"), State("sub-query-k", "value"), State("url", "search"),
          prevent_initial_call=True)
def pin_from_query(_n: Any, _l: Any, head: str | None, depth: Any, layers: str | None, k: Any,
                   search: str | None) -> tuple[Any, Any]:
    """Pin the heads of a server query (GET /api/subgraph on the URL's pairings and metric): the
    neighbourhood of a head to a depth, or the heads of a layer range's top-k edges, as one
    ``pin-many`` record; the API's refusal (an unknown head, a bad range) is the message."""
    state = state_of(search)
    client = api()
    common = {"pairings": list(state.pairings), "rank_on": rank_on(state.metric)}
    try:
        if ctx.triggered_id == "sub-pin-neighbourhood-btn":
            head = (head or "").strip()
            if not head:
                return no_update, "type a head (e.g. L4H7) to pin its neighbourhood"
            answer = client.subgraph(state.model, head=head, depth=int(depth or 1), cap=QUERY_K_MAX, **common)
            what = f"the neighbourhood of {head} (depth {int(depth or 1)})"
        else:
            layers = (layers or "").strip()
            if not layers:
                return no_update, "type a layer range (e.g. 10-20)"
            top = max(1, min(int(k or 10), QUERY_K_MAX))
            answer = client.subgraph(state.model, layers=layers, k=top, cap=top, **common)
            what = f"the top {top} edges of layers {layers}"
    except ApiError as err:
        return no_update, [html.B("not pinned: "), err.message]
    except (TypeError, ValueError):
        return no_update, "depth and top must be whole numbers"
    heads = query_heads(answer)
    if not heads:
        return no_update, f"{what}: no edges on {', '.join(state.pairings) or 'no pairing'}"
    left = f"; {answer['left_out']} weaker edges left out" if answer.get("left_out") else ""
    return ({"op": "pin-many", "heads": heads, "t": time.time()},
            f"pinned {len(heads)} heads of {what}: {len(answer.get('edges', []))} edges{left}")


@callback(Output("sub-action", "data", allow_duplicate=True), Output("sub-msg", "children", allow_duplicate=True),
          Output("sub-import", "contents"),
          Input("sub-import", "contents"), State("sub-import", "filename"), prevent_initial_call=True)
def import_subgraph(contents: str | None, filename: str | None) -> tuple[Any, Any, Any]:
    """An exported subgraph's JSON as an ``import`` record; a bad file: its message, no change."""
    if not contents:
        return no_update, no_update, no_update
    try:
        action = parse_import(decode_upload(contents), vocab().is_head)
    except (SubgraphImportError, ApiError) as err:
        message = err.message if isinstance(err, ApiError) else str(err)
        return no_update, [html.B("import rejected: "), f"{filename or 'file'}: {message}"], None
    return ({**action, "t": time.time()}, f"imported {filename or 'subgraph'}: {len(action['pins'])} pinned heads",
            None)


@callback(Output("sub-download", "data"), Output("sub-export-msg", "children"),
          Input("sub-export-json-btn", "n_clicks"), Input("sub-export-graphml-btn", "n_clicks"),
          State("url", "search"), State("labels-store", "data"), prevent_initial_call=True)
def export_subgraph(_j: Any, _g: Any, search: str | None, label_sets: list | None) -> tuple[Any, Any]:
    """The shown subgraph as JSON (what reproduces it and the edges with their numbers) or GraphML."""
    state = state_of(search, label_sets)
    if not state.pins:
        return no_update, "nothing pinned to export"
    try:
        answer, drawn = load_subgraph(api(), state)
    except ApiError as err:
        return no_update, err.message
    record = export_record(model=state.model, metric=state.metric, pairings=state.pairings, pins=state.pins,
                           groups=state.groups, labels=dict(state.labels), answer=answer, drawn=drawn)
    stem = "subgraph-" + "".join(c if c.isalnum() or c in "-_." else "-" for c in state.model)
    if ctx.triggered_id == "sub-export-graphml-btn":
        return {"content": export_graphml(record), "filename": stem + ".graphml"}, "GraphML exported"
    return {"content": json.dumps(record, indent=1), "filename": stem + ".json"}, "JSON exported"


@callback(Output("uploaded-store", "data", allow_duplicate=True), Output("sub-save-msg", "children"),
          Input("sub-save-btn", "n_clicks"), State("url", "search"), prevent_initial_call=True)
def save_groups(_n: Any, search: str | None) -> tuple[Any, Any]:
    """The groups as a label set (POST /api/labels, ``groups-<model>``); recorded as an upload,
    so the overlay list reloads and the URL writer selects it."""
    state = state_of(search)
    if not state.groups:
        return no_update, "no groups to save: group some pinned heads first"
    client = api()
    try:
        answer = client.subgraph(state.model, heads=list(state.pins), pairings=list(state.pairings), cap=1)
        body = label_set_body(state.model, state.groups, answer)
        saved = client.upload_labels(json.dumps(body).encode(), body["name"] + ".json", model=state.model,
                                     name=body["name"])
    except ApiError as err:
        return no_update, [html.B("not saved: "), err.message]
    name = saved.get("name", body["name"])
    return {"name": name, "t": time.time()}, f"saved label set {name}: {len(body['classes'])} heads"
