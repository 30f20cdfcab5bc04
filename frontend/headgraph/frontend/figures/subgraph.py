"""The subgraph view's pure parts: pinned heads' edges (GET /api/subgraph) with groups drawn as
one node, a layered layout, and the JSON / GraphML export and import of a subgraph.

Groups (supernodes) aggregate edges: the edges of one pairing between two drawn nodes (a head
or a group) become one edge whose value is the SUM of the member edges' values on the chosen
metric, with their COUNT (AGGREGATION). Edges inside one group are not drawn; the group node
counts them. The figure itself is figures.graph.graph_figure's (colours, arrowheads, hovers),
on layered positions (layer on the y axis), with custom labels as node text and each edge's
value written at its middle.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import networkx as nx
import plotly.graph_objects as go

from headgraph.frontend.figures.common import fmt_value
from headgraph.frontend.figures.graph import graph_figure
from headgraph.frontend.figures.palette import JOINED
from headgraph.frontend.state.subgraph import GROUPS_MAX, NAME_MAX, PINS_MAX

EXPORT_FORMAT = "headgraph-subgraph"
EXPORT_VERSION = 1
GROUP_PREFIX = "group:"  # a group node's id (never a head name)
AGGREGATION = "sum of the member edges' values on the chosen metric, per pairing, with their count"
RANK_ON = {"raw": "pk", "normalized": "normalized", "z": "z", "cs": "cs"}  # the page's metric -> the API's
METRIC_WORDS = {"pk": "raw PK", "normalized": "normalized PK", "z": "z-score", "cs": "CS"}
IMPORT_MAX_BYTES = 1 << 20
_SET_NAME = re.compile(r"[^A-Za-z0-9_.\-]+")


def rank_on(metric: str) -> str:
    """The API's ``rank_on`` for the page's metric switch (raw, normalized, z, cs; the
    heatmap-only CKA and Procrustes rank by raw PK)."""
    return RANK_ON.get(metric, "pk")


def node_id(name: str, groups: Sequence[tuple[str, Sequence[str]]]) -> str:
    """The drawn node of a head: its group's node, else the head itself."""
    for group, members in groups:
        if name in members:
            return GROUP_PREFIX + group
    return name


def aggregate(answer: Mapping[str, Any], groups: Sequence[tuple[str, Sequence[str]]],
              labels: Mapping[str, str], classes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Node-link data of an API subgraph with groups drawn as one node (module docstring).

    Nodes: {id, name, label, kind ("head" | "kv_group" | "group"), layer, head, heads, members,
    internal (a group's edges among its own heads), head_class}; edges: {source, target,
    pairing, value, count, members ("L0H1>L1H3" each), score (= value, the figure's weight),
    opacity (|value| / the pairing's largest |value|)}, strongest first per pairing.
    """
    classes = classes or {}
    by_name = {str(n["name"]): n for n in answer.get("nodes", [])}
    nodes: dict[str, dict[str, Any]] = {}
    for name, n in by_name.items():
        ident = node_id(name, groups)
        if ident != name:
            continue
        heads = [str(h) for h in n.get("heads") or [name]]
        cls = JOINED.join(dict.fromkeys(classes[h] for h in heads if h in classes))
        nodes[name] = {"id": name, "name": name, "label": labels.get(name, name), "kind": n.get("kind", "head"),
                       "layer": int(n["layer"]), "head": int(n["head"]), "heads": ",".join(heads),
                       "members": [name], "internal": 0, "head_class": cls}
    for group, members in groups:
        layers = sorted(int(by_name[m]["layer"]) for m in members if m in by_name)
        heads = [str(h) for m in members for h in (by_name.get(m, {}).get("heads") or [m])]
        cls = JOINED.join(dict.fromkeys(classes[h] for h in heads if h in classes))
        nodes[GROUP_PREFIX + group] = {
            "id": GROUP_PREFIX + group, "name": group, "label": labels.get(group, group), "kind": "group",
            "head_name": "group", "layer": layers[(len(layers) - 1) // 2] if layers else 0,
            "head": 0, "heads": ",".join(heads), "members": list(members), "internal": 0, "head_class": cls}
    sums: dict[tuple[str, str, str], dict[str, Any]] = {}
    for e in answer.get("edges", []):
        s, t = node_id(str(e["source"]), groups), node_id(str(e["target"]), groups)
        if s not in nodes or t not in nodes:
            continue
        if s == t:
            nodes[s]["internal"] += 1
            continue
        row = sums.setdefault((s, t, str(e["pairing"])), {"source": s, "target": t, "pairing": str(e["pairing"]),
                                                           "value": 0.0, "count": 0, "members": []})
        row["value"] += float(e["value"])
        row["count"] += 1
        row["members"].append(f"{e['source']}>{e['target']}")
    top: dict[str, float] = {}
    for row in sums.values():
        top[row["pairing"]] = max(top.get(row["pairing"], 0.0), abs(row["value"]))
    edges = sorted(sums.values(), key=lambda r: (r["pairing"], -r["value"], r["source"], r["target"]))
    for rank, row in enumerate(edges, start=1):
        row.update(score=row["value"], rank=rank,
                   opacity=min(1.0, max(0.15, abs(row["value"]) / top[row["pairing"]])) if top[row["pairing"]] else 1.0)
    degree: dict[str, int] = {}
    for row in edges:
        for end in (row["source"], row["target"]):
            degree[end] = degree.get(end, 0) + 1
    for ident, n in nodes.items():
        n["degree"] = degree.get(ident, 0)
    return {"nodes": list(nodes.values()), "edges": edges}


def layered_positions(nodes: Sequence[Mapping[str, Any]]) -> tuple[dict[str, tuple[float, float]], list[int]]:
    """(positions, layers): y = the row of the node's layer (deeper higher), x = its slot in the
    row (query heads, then KV groups, then groups, each by head index / name), centred."""
    layers = sorted({int(n["layer"]) for n in nodes})
    row = {layer: i for i, layer in enumerate(layers)}
    kind_order = {"head": 0, "kv_group": 1, "group": 2}
    by_row: dict[int, list[Mapping[str, Any]]] = {}
    for n in nodes:
        by_row.setdefault(row[int(n["layer"])], []).append(n)
    pos: dict[str, tuple[float, float]] = {}
    for r, members in by_row.items():
        members = sorted(members, key=lambda n: (kind_order.get(str(n.get("kind")), 3), int(n.get("head", 0)),
                                                 str(n["id"])))
        for i, n in enumerate(members):
            pos[str(n["id"])] = (float(i) - (len(members) - 1) / 2.0, float(r))
    return pos, layers


LABEL_STAGGER = 0.2  # OQ's value at 0.3 of its edge, OK's at 0.5, OV's at 0.7


def subgraph_figure(data: Mapping[str, Any], *, rank_on_: str, class_order: Sequence[str] = (),
                    title: str = "") -> go.Figure:
    """The subgraph drawn by graph_figure on layered positions: node text = custom label, hover
    names the head (or group and members) and its label; each edge's value (and count when it
    aggregates several) written at its middle."""
    nodes, edges = list(data["nodes"]), list(data["edges"])
    pos, layers = layered_positions(nodes)
    pairings = list(dict.fromkeys(e["pairing"] for e in edges))
    counts = {p: sum(1 for e in edges if e["pairing"] == p) for p in pairings}
    fig = graph_figure({"graph": {"nodes": nodes, "edges": edges}, "pairings": pairings, "edge_counts": counts,
                        "layer_indices": layers, "rule": title, "hubs": {"hubs": []}},
                       pos, layout="grid", class_order=class_order, pinned=[str(n["id"]) for n in nodes])
    words = METRIC_WORDS.get(rank_on_, rank_on_)
    label_of = {str(n["id"]): str(n["label"]) for n in nodes}
    info = {str(n["id"]): n for n in nodes}
    by_edge = {(e["source"], e["target"], e["pairing"]): e for e in edges}
    traces: list[Any] = list(fig.data)
    for tr in traces:
        custom = tr.customdata
        if custom is None or not len(custom) or not isinstance(custom[0], (list, tuple)):
            continue
        kind = custom[0][0]
        if kind == "node" and tr.mode == "markers+text":
            tr.text = [label_of.get(str(c[1]), str(c[1])) for c in custom]
            tr.hovertext = [node_hover(info.get(str(c[1]), {})) for c in custom]
            tr.hovertemplate = "%{hovertext}<extra></extra>"
        elif kind == "edge":
            tr.text = [edge_hover(by_edge.get((c[1], c[2], c[3]), {}), label_of, words) for c in custom]
    xs, ys, texts = [], [], []
    shift = {"OQ": -1, "OK": 0, "OV": 1}
    for e in edges:
        (x0, y0), (x1, y1) = pos[e["source"]], pos[e["target"]]
        norm = math.hypot(x1 - x0, y1 - y0) or 1.0
        off = shift.get(e["pairing"], 0) * 0.045
        # the pairings' values of one node pair staggered along the edge, not stacked at its
        # middle (three labels of a group's edges overlapped there)
        at = 0.5 + shift.get(e["pairing"], 0) * LABEL_STAGGER
        xs.append(x0 + (x1 - x0) * at - (y1 - y0) / norm * off)
        ys.append(y0 + (y1 - y0) * at + (x1 - x0) / norm * off)
        texts.append(fmt_value(e["value"]) + (f" ×{e['count']}" if e["count"] > 1 else ""))
    if edges:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="text", text=texts, textfont=dict(size=9, color="#444"),
                                 hoverinfo="skip", showlegend=False, name="edge values", meta="edge-values"))
    fig.update_xaxes(title="", showticklabels=False, showgrid=False, zeroline=False,
                     range=[min((p[0] for p in pos.values()), default=0) - 1,
                            max((p[0] for p in pos.values()), default=0) + 1])
    fig.update_layout(height=max(420, 150 * len(layers) + 160))
    return fig


def node_hover(n: Mapping[str, Any]) -> str:
    """A node's hover: name, label, class, and a group's members and inside edges."""
    if not n:
        return ""
    out = f"<b>{n.get('label')}</b>" + (f" ({n.get('name')})" if n.get("label") != n.get("name") else "")
    out += f"<br>class: {n.get('head_class') or 'no class'}"
    if n.get("kind") == "group":
        out += f"<br>group of {', '.join(n.get('members') or [])}<br>edges inside: {n.get('internal', 0)}"
    elif n.get("kind") == "kv_group":
        out += f"<br>KV group of {str(n.get('heads') or '').replace(',', ', ')}"
    return out + f"<br>edges drawn: {n.get('degree', 0)}"


def edge_hover(e: Mapping[str, Any], label_of: Mapping[str, str], words: str) -> str:
    """An edge's hover: its ends (labels), pairing, value and, aggregated, the sum and count."""
    if not e:
        return ""
    head = f"<b>{e['pairing']} {label_of.get(e['source'], e['source'])} → {label_of.get(e['target'], e['target'])}</b>"
    if e.get("count", 1) > 1:
        return (head + f"<br>{words}: sum {fmt_value(e['value'])} over {e['count']} edges"
                + "<br>" + ", ".join(m.replace(">", " → ") for m in e.get("members", [])))
    return head + f"<br>{words} {fmt_value(e['value'])}"


# -- export, import, label set ----------------------------------------------------------------

def export_record(*, model: str, metric: str, pairings: Sequence[str], pins: Sequence[str],
                  groups: Sequence[tuple[str, Sequence[str]]], labels: Mapping[str, str],
                  answer: Mapping[str, Any], drawn: Mapping[str, Any]) -> dict[str, Any]:
    """The subgraph as one JSON record: what reproduces it (model, metric, pairings, pins,
    groups, labels) and what it showed (the API's edges with their numbers, the drawn nodes
    and aggregated edges, the aggregation rule, what the cap left out)."""
    return {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "model": model, "metric": metric,
            "rank_on": rank_on(metric), "pairings": list(pairings), "pins": list(pins),
            "groups": {name: list(members) for name, members in groups}, "labels": dict(labels),
            "rule": answer.get("rule"), "aggregation": AGGREGATION,
            "total": answer.get("total"), "left_out": answer.get("left_out"),
            "edges": list(answer.get("edges", [])),
            "nodes": [{k: v for k, v in n.items() if k != "degree"} for n in drawn["nodes"]],
            "drawn_edges": list(drawn["edges"])}


def export_graphml(record: Mapping[str, Any]) -> str:
    """The drawn subgraph (groups as one node, aggregated edges keyed by pairing) as GraphML
    (networkx.write_graphml); graph attributes name the model, metric and aggregation."""
    g = nx.MultiDiGraph(model=str(record["model"]), metric=str(record["metric"]), rank_on=str(record["rank_on"]),
                        pairings=",".join(record["pairings"]), aggregation=AGGREGATION)
    for n in record["nodes"]:
        g.add_node(str(n["id"]), label=str(n["label"]), kind=str(n["kind"]), layer=int(n["layer"]),
                   heads=str(n.get("heads") or ""), members=",".join(n.get("members") or []),
                   head_class=str(n.get("head_class") or ""), internal=int(n.get("internal") or 0))
    for e in record["drawn_edges"]:
        g.add_edge(str(e["source"]), str(e["target"]), key=str(e["pairing"]), pairing=str(e["pairing"]),
                   value=float(e["value"]), count=int(e["count"]), members=",".join(e["members"]))
    buf = io.BytesIO()
    nx.write_graphml(g, buf)
    return buf.getvalue().decode()


class SubgraphImportError(ValueError):
    """A subgraph file that cannot be imported; the message says why."""


def parse_import(raw: bytes, is_head: Any) -> dict[str, Any]:
    """The ``import`` action of an exported subgraph's JSON bytes (checked: the format mark,
    head names, groups of pinned heads, labels of pins or groups); SubgraphImportError naming the
    first problem otherwise.

    Bounded like the link it becomes (state.subgraph: at most PINS_MAX pins and group members,
    GROUPS_MAX groups, a label per pin or group; IMPORT_MAX_BYTES of file), each count checked
    before any item is, and linear in the file: membership is tested in sets.
    """
    if len(raw) > IMPORT_MAX_BYTES:
        raise SubgraphImportError(f"the file is over {IMPORT_MAX_BYTES // 1024} KiB")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise SubgraphImportError(f"not a JSON file ({err})") from err
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise SubgraphImportError(f'not a headgraph subgraph export (no "format": "{EXPORT_FORMAT}")')
    pins = data.get("pins")
    if isinstance(pins, list) and len(pins) > PINS_MAX:
        raise SubgraphImportError(f"{len(pins)} pins: a subgraph holds at most {PINS_MAX} pinned heads")
    if not isinstance(pins, list) or not pins or not all(isinstance(p, str) and is_head(p) for p in pins):
        raise SubgraphImportError("pins must be a non-empty list of head names such as L0H1")
    pinned = set(pins)
    groups = data.get("groups") or {}
    if not isinstance(groups, dict):
        raise SubgraphImportError("groups must be an object: group name -> list of pinned heads")
    if len(groups) > GROUPS_MAX:
        raise SubgraphImportError(f"{len(groups)} groups: a subgraph holds at most {GROUPS_MAX} groups")
    for name, members in groups.items():
        if not isinstance(members, list) or not members:
            raise SubgraphImportError(f"group {_short(name)} must list its heads")
        if len(members) > PINS_MAX:
            raise SubgraphImportError(f"group {_short(name)} lists {len(members)} heads: at most {PINS_MAX} "
                                      "(the pinned heads)")
        missing = [m for m in members if not isinstance(m, str) or m not in pinned]
        if missing:
            raise SubgraphImportError(f"group {_short(name)} names {', '.join(_short(m) for m in missing[:8])}, "
                                      "which is not pinned")
    labels = data.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise SubgraphImportError("labels must be an object: head or group name -> text")
    if len(labels) > PINS_MAX + GROUPS_MAX:
        raise SubgraphImportError(f"{len(labels)} labels: at most one per pin or group "
                                  f"({PINS_MAX + GROUPS_MAX})")
    unknown = [k for k in labels if k not in pinned and k not in groups]
    if unknown:
        raise SubgraphImportError(f"labels name {', '.join(_short(k) for k in unknown[:8])}, neither a pin nor a group")
    model = data.get("model")
    return {"op": "import", "model": model if isinstance(model, str) else None, "metric": data.get("metric"),
            "pairings": [p for p in data.get("pairings") or [] if isinstance(p, str)], "pins": pins,
            "groups": [(name, members) for name, members in groups.items()],
            "labels": list(labels.items())}


def _short(value: Any) -> str:
    """A name from an imported file as a message quotes it: repr, at most NAME_MAX characters."""
    text = repr(value)
    return text if len(text) <= NAME_MAX else text[:NAME_MAX - 1] + "…"


def label_set_name(model: str) -> str:
    """The label set the groups are saved as: ``groups-<model>`` in the API's name alphabet."""
    slug = _SET_NAME.sub("-", model).strip("-._") or "model"
    return ("groups-" + slug)[:64].rstrip("-._")


def label_set_body(model: str, groups: Sequence[tuple[str, Sequence[str]]],
                   answer: Mapping[str, Any]) -> dict[str, Any]:
    """POST /api/labels JSON of the groups: each group's query heads (a KV group's members)
    get the group's name as their class."""
    heads_of = {str(n["name"]): [str(h) for h in n.get("heads") or [n["name"]]] for n in answer.get("nodes", [])}
    classes: dict[str, str] = {}
    for name, members in groups:
        for m in members:
            for h in heads_of.get(m, [m]):
                classes.setdefault(h, name)
    return {"name": label_set_name(model), "model": model,
            "description": "groups of pinned heads saved from the dashboard's subgraph view", "classes": classes}
