"""The head graph figure: heads as nodes (coloured by class, hubs starred), edges coloured by pairing.

Edges carry invisible click handles so Dash callbacks can open an edge's detail panel, and an
arrowhead at their target in every layout. A node's hover lists its strongest incoming and
outgoing edges per pairing. Above LABEL_ALL_MAX nodes only the heads that matter are labelled:
hubs, the endpoints of each pairing's strongest edges, and the pinned ones (selected, found).
Class colours come from figures.palette (the label set's class order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from headgraph.frontend.figures.circuit import CircuitMarks
from headgraph.frontend.figures.circuit import edge_note as circuit_edge_note
from headgraph.frontend.figures.circuit import rings as circuit_rings
from headgraph.frontend.figures.circuit import underlay as circuit_underlay
from headgraph.frontend.figures.common import base_layout, fmt_value, pairing_color
from headgraph.frontend.figures.graph_filters import (
    Verdicts,
    edge_key,
    null_quantiles,
    verdict_counts,
    verdict_of,
)
from headgraph.frontend.figures.handles import place_handles
from headgraph.frontend.figures.palette import LEGEND_SYMBOL, NO_CLASS_COLOR, class_palette
from headgraph.frontend.figures.positions import Positions, grid_row, is_kv_node
from headgraph.frontend.figures.verdicts import verdict_hover, verdict_legend, verdict_line

KV_NOTE = ("<br>KV group: shared keys/values of %s<br>(drawn on its layer's row, between "
           "those query heads)")
LABEL_ALL_MAX = 48   # up to this many nodes every node is labelled
LABEL_TOP_EDGES = 3  # above it: the endpoints of each pairing's this-many strongest edges
HOVER_EDGES = 3      # a node's hover: its strongest incoming / outgoing edges per pairing
ARROW_PX = 9         # arrowhead marker size
SHIFT_PX = 4         # a free layout's sideways gap between the pairings' edges of one head pair

# Pixels. Plotly hovers, among the markers under the pointer, the one with the smallest radius,
# so markers must not cover each other's centres: node sizes are capped below a row's height,
# and edge handles go where they cover no node (figures.handles).
ROW_PX = 36            # grid pixels per layer row
MARGIN_Y_PX = 110      # top + bottom margins (base_layout)
MIN_PLOT_WIDTH_PX = 560  # the narrowest plot area assumed when converting x to pixels
BACKDROP_SIZE = 7      # marker diameter of a head without edges


def node_size(node: dict[str, Any]) -> float:
    """Marker diameter (px) of a graph node: grows with degree, capped so rows never overlap."""
    hub = bool(node.get("is_hub"))
    size = (16 if hub else 10) + 5 * math.sqrt(float(node.get("degree", 0) or 0))
    return min(size, 24.0 if hub else 20.0)


def grid_height(pos: Positions) -> int:
    """Figure height (px) of the grid layout: at least 600, ROW_PX per row."""
    rows = {grid_row(p[1]) for p in pos.values()}
    return max(600, int((len(rows) + 1.4) * ROW_PX + MARGIN_Y_PX))


def _pixel_scale(pos: Positions, height: int, layout: str) -> tuple[float, float]:
    """Lower bounds of pixels per data unit along x and y (the plot's width is not known)."""
    xs = [p[0] for p in pos.values()] or [0.0]
    ys = [p[1] for p in pos.values()] or [0.0]
    plot_h = max(1.0, height - MARGIN_Y_PX)
    if layout == "grid":
        y_span = (max(ys) - min(ys)) + 1.4  # the y range set below: rows - 0.8 .. + 0.6
        return MIN_PLOT_WIDTH_PX / ((max(xs) - min(xs)) + 1.0), plot_h / y_span
    span = max(max(xs) - min(xs), max(ys) - min(ys), 1e-9) * 1.1
    scale = min(plot_h, MIN_PLOT_WIDTH_PX) / span  # equal aspect (scaleanchor)
    return scale, scale


SINK_COLOR = "#6a3d9a"  # outline of an attention-sink head's node


def what_note(node: dict[str, Any]) -> str:
    """Hover lines of what a node's head does (the API's pattern-based description and sink
    flag; "not measured" when the model's pattern scores are not there)."""
    if node.get("description") is None and node.get("sink") is None:
        return "<br>what it does: not measured"
    out = f"<br>what it does: {node.get('description') or 'unclassified'}"
    if node.get("sink"):
        first = node.get("first_token")
        out += ("<br><b>attention sink</b>" + (f" (first-token attention {first:.2f})" if first is not None else "")
                + ": its output barely varies, so its edges are weak evidence")
    return out


def sink_note(edge: dict[str, Any]) -> str:
    """Hover line of an edge that starts (or ends) at an attention-sink head."""
    if edge.get("source_sink"):
        return "<br>source is an attention sink (dotted): weak evidence"
    if edge.get("target_sink"):
        return "<br>target is an attention sink"
    return ""


def kv_note(node: dict[str, Any]) -> str:
    """Hover line of a KV-group node naming the query heads it serves ('' for a query head)."""
    if not is_kv_node(node):
        return ""
    heads = ", ".join(h for h in str(node.get("heads") or "").split(",") if h)
    return KV_NOTE % (heads or "its query heads")


def _offset(p0: tuple[float, float], p1: tuple[float, float], shift: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """Segment p0-p1 moved sideways by ``shift`` (so parallel pairings stay apart)."""
    dx, dy = p1[0] - p0[0], p1[1] - p0[1]
    norm = math.hypot(dx, dy) or 1.0
    ox, oy = -dy / norm * shift, dx / norm * shift
    return (p0[0] + ox, p0[1] + oy), (p1[0] + ox, p1[1] + oy)


def _strength(edge: dict[str, Any]) -> tuple[float, float]:
    """Sort key, strongest first: the API's rank within its pairing, then the score."""
    rank = edge.get("rank")
    return (float(rank) if isinstance(rank, (int, float)) else math.inf, -float(edge.get("score") or 0.0))


def strongest_edges(edges: Sequence[dict[str, Any]], per_pairing: int = LABEL_TOP_EDGES) -> list[dict[str, Any]]:
    """Each pairing's ``per_pairing`` strongest edges (the API's rank, then the score)."""
    by_pairing: dict[str, list[dict[str, Any]]] = {}
    for e in edges:
        by_pairing.setdefault(str(e.get("pairing", e.get("key", ""))), []).append(e)
    return [e for p in sorted(by_pairing) for e in sorted(by_pairing[p], key=_strength)[:per_pairing]]


def labelled_nodes(nodes: Sequence[dict[str, Any]], edges: Sequence[dict[str, Any]],
                   pinned: Sequence[str] = ()) -> set[str]:
    """The nodes that carry their name: all of them up to LABEL_ALL_MAX nodes; above that the
    hubs, the endpoints of each pairing's LABEL_TOP_EDGES strongest edges, and ``pinned``."""
    ids = {str(n["id"]) for n in nodes}
    if len(ids) <= LABEL_ALL_MAX:
        return ids
    out = {str(n["id"]) for n in nodes if n.get("is_hub")}
    for e in strongest_edges(edges):
        out |= {str(e["source"]), str(e["target"])}
    return (out | set(pinned)) & ids


def edge_line(edge: dict[str, Any], other: str, arrow: str, verdicts: Verdicts | None) -> str:
    """One hover line of a node's edge: the other head, PK, normalized PK, the verdict if measured."""
    text = f"{arrow} {other}: PK {fmt_value(edge.get('score'))} · norm {fmt_value(edge.get('normalized'))}"
    if verdicts is not None and edge_key(edge) in verdicts:
        text += f" · {verdict_of(edge, verdicts)}"
    return text


def edge_lists(edges: Sequence[dict[str, Any]], verdicts: Verdicts | None = None,
               per: int = HOVER_EDGES) -> dict[str, str]:
    """node -> hover lines of its ``per`` strongest outgoing and incoming edges per pairing
    (strongest first, by the API's rank), with how many more it has."""
    rows: dict[str, dict[tuple[str, str], list[dict[str, Any]]]] = {}
    for e in edges:
        p = str(e.get("pairing", e.get("key", "")))
        rows.setdefault(str(e["source"]), {}).setdefault((p, "out"), []).append(e)
        rows.setdefault(str(e["target"]), {}).setdefault((p, "in"), []).append(e)
    out: dict[str, str] = {}
    for node, groups in rows.items():
        lines = []
        for (p, direction) in sorted(groups, key=lambda k: (k[0], k[1] != "out")):
            ranked = sorted(groups[(p, direction)], key=_strength)
            lines.append(f"<b>{p} {direction}</b> ({len(ranked)})")
            for e in ranked[:per]:
                other, arrow = (e["target"], "→") if direction == "out" else (e["source"], "←")
                lines.append("&nbsp;&nbsp;" + edge_line(e, str(other), arrow, verdicts))
            if len(ranked) > per:
                lines.append(f"&nbsp;&nbsp;… {len(ranked) - per} more")
        out[node] = "<br>" + "<br>".join(lines)
    return out


def graph_figure(data: dict[str, Any], pos: Positions, *, layout: str,
                 classes: dict[str, str] | None = None, all_heads: Sequence[str] = (),
                 head_pos: Positions | None = None, selected: str | None = None,
                 selected_edge: tuple[str, str, str] | None = None,
                 backdrop: Sequence[dict[str, Any]] = (),
                 verdicts: Verdicts | None = None,
                 highlight: Sequence[str] = (), class_order: Sequence[str] = (),
                 pinned: Sequence[str] = (), circuit: CircuitMarks | None = None) -> go.Figure:
    """The head graph: edges coloured by pairing with opacity = score / max, hubs marked.

    Each edge gets an invisible marker on it (customdata ["edge", source, target, pairing]) so it
    can be hovered and clicked; nodes carry customdata ["node", name]. A grouped-query model's
    KV-group nodes (L6KV1) are diamonds whose hover names the query heads they serve; in the
    grid layout they sit on their layer's row between those heads (positions.grid_positions).
    ``backdrop``: node records of ``all_heads`` (their KV members for the hover).
    ``verdicts``: edges drawn by their path-ablation verdict (figures.verdicts; customdata
    gains the verdict, a legend entry per verdict); ``highlight``: nodes ringed (a search).
    ``class_order``: the overlay's class order (figures.palette: a class's colour);
    ``pinned``: nodes labelled whatever the graph's size (besides the selected and found ones).
    ``circuit``: a task's circuit (figures.circuit.circuit_marks): its edges drawn over a wide
    underlay, its heads ringed (legend "in <task> circuit"), attribution in the hovers.
    """
    g = data["graph"]
    nodes = g.get("nodes", [])
    edges = g.get("edges", g.get("links", []))
    classes = classes or {}
    shift = {"OQ": -1, "OK": 0, "OV": 1}
    height = grid_height(head_pos or pos) if layout == "grid" else 600
    scale = _pixel_scale(head_pos or pos, height, layout)
    # pairings drawn apart sideways: a share of a grid column, or SHIFT_PX in a free layout
    # (a share of its span put edges tens of pixels off their nodes when one node lay far out)
    step = 0.045 if layout == "grid" else SHIFT_PX / scale[0]
    fig = go.Figure()
    # Edges: one trace per (pairing, opacity bucket) keeps the trace count bounded.
    buckets: dict[tuple[str, int, bool, str], tuple[list[float | None], list[float | None]]] = {}
    # arrowheads: the edge's points and each tip's standoff (px) from the target's centre
    arrows: dict[tuple[str, int, bool, str], tuple[list[float | None], list[float | None], list[float]]] = {}
    mids: dict[str, dict[str, list[Any]]] = {}
    in_circuit: tuple[list[float | None], list[float | None]] = ([], [])
    # Click handles sit at a fraction of the edge that depends on the source node, so edges that
    # cross at their midpoints (same layer pair, same head sum) still get distinct handles.
    order = {n: i for i, n in enumerate(sorted(pos, key=lambda n: (pos[n][1], pos[n][0], n)))}
    drawn = [e for e in edges if e["source"] in pos and e["target"] in pos]
    segments = [_offset(pos[e["source"]], pos[e["target"]], shift.get(e.get("pairing", e.get("key", "")), 0) * step)
                for e in drawn]
    obstacles = {str(n["id"]): node_size(n) / 2 for n in nodes if n["id"] in pos}
    if head_pos:
        for h in all_heads:
            if h not in obstacles and h in head_pos:
                obstacles[h] = BACKDROP_SIZE / 2
    where = {**(head_pos or {}), **pos}
    node_classes = {str(n["id"]): classes.get(n["id"]) or n.get("head_class") or "" for n in nodes}
    handles = place_handles(segments, [0.3 + 0.4 * order[e["source"]] / max(1, len(order) - 1) for e in drawn],
                            [where[n] for n in obstacles], list(obstacles.values()), scale)
    for i, e in enumerate(drawn):
        s, t, p = e["source"], e["target"], e.get("pairing", e.get("key", ""))
        a, b = segments[i]
        alpha_bucket = max(1, min(10, round(float(e.get("opacity", 1.0)) * 10)))
        sink = bool(e.get("source_sink"))  # dotted: the source's output barely varies
        verdict = "" if verdicts is None else verdict_of(e, verdicts)
        xs, ys = buckets.setdefault((p, alpha_bucket, sink, verdict), ([], []))
        xs += [a[0], b[0], None]
        ys += [a[1], b[1], None]
        ax, ay, off = arrows.setdefault((p, alpha_bucket, sink, verdict), ([], [], []))
        ax += [a[0], b[0], None]
        ay += [a[1], b[1], None]
        off += [0.0, obstacles.get(t, BACKDROP_SIZE / 2) + 1, 0.0]  # the tip on the node's rim
        m = mids.setdefault(p, {"x": [], "y": [], "size": [], "custom": [], "text": []})
        m["x"].append(handles.x[i])
        m["y"].append(handles.y[i])
        m["size"].append(round(handles.size[i], 1))
        m["custom"].append(["edge", s, t, p] + ([verdict] if verdicts is not None else []))
        extra = "".join(f" · {k} {fmt_value(e.get(k))}" for k in ("z", "q") if e.get(k) is not None)
        m["text"].append(f"<b>{p} {s} → {t}</b><br>{node_classes.get(s) or 'no class'} → "
                         f"{node_classes.get(t) or 'no class'}<br>PK {fmt_value(e.get('score'))} · normalized "
                         f"{fmt_value(e.get('normalized'))}{extra}<br>CS {fmt_value(e.get('cs'))} · "
                         f"rank {e.get('rank', '–')}<br>opacity {fmt_value(e.get('opacity'))}"
                         + sink_note(e) + ("" if verdicts is None else verdict_hover(verdicts.get(edge_key(e))))
                         + circuit_edge_note(circuit, (s, t, p)))
        if circuit and (s, t, p) in circuit["edges"]:
            in_circuit[0].extend([a[0], b[0], None])
            in_circuit[1].extend([a[1], b[1], None])
    if circuit and in_circuit[0]:
        fig.add_trace(circuit_underlay(*in_circuit, circuit, len(in_circuit[0]) // 3))
    pairings = list(dict.fromkeys(list(data.get("pairings", [])) + [p for p, _, _, _ in sorted(buckets)]))
    counts = data.get("edge_counts", {})
    for p in pairings:
        first = verdicts is None  # by verdict: the pairing's own legend line (below), in its colour
        if not first and any(bp == p for bp, _, _, _ in buckets):
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", hoverinfo="skip",
                                     line=dict(color=pairing_color(p), width=2.2), name=f"{p} ({counts.get(p, '')})",
                                     legendgroup=p, showlegend=True, legendrank=1))
        for (bp, bucket, sink, verdict), (xs, ys) in sorted(buckets.items()):
            if bp != p:
                continue
            line = (dict(color=pairing_color(p, bucket / 10), width=2.2, dash="dot" if sink else "solid")
                    if verdicts is None else verdict_line(p, bucket / 10, verdict, sink))
            # Arrowheads at the targets: markers at the end of an invisible copy of each edge,
            # along it (angleref "previous"), stood off from the target's centre by its radius
            # in pixels whatever the zoom or the layout's scale.
            ax, ay, off = arrows[(bp, bucket, sink, verdict)]
            fig.add_trace(go.Scatter(x=ax, y=ay, mode="lines+markers", hoverinfo="skip",
                                     line=dict(color="rgba(0,0,0,0)", width=0),
                                     marker=dict(symbol="arrow", angleref="previous", color=line["color"],
                                                 size=[0, ARROW_PX, 0] * (len(ax) // 3), standoff=off,
                                                 line=dict(width=0)),
                                     name=f"{p} arrows", legendgroup=p, showlegend=False))
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", line=line,
                                     name=f"{p} ({counts.get(p, '')})", legendgroup=p,
                                     showlegend=first, legendrank=1,
                                     meta=verdict or None))
            first = False
    if verdicts is not None:
        verdict_legend(fig, verdict_counts(drawn, verdicts), null_quantiles(verdicts))
    if selected_edge and selected_edge[0] in pos and selected_edge[1] in pos:
        s, t, p = selected_edge
        a, b = _offset(pos[s], pos[t], shift.get(p, 0) * step)
        fig.add_trace(go.Scatter(x=[a[0], b[0]], y=[a[1], b[1]], mode="lines", hoverinfo="skip",
                                 line=dict(color="rgba(245,166,35,0.55)", width=9), showlegend=False,
                                 name="selected edge"))
    for p, m in mids.items():
        fig.add_trace(go.Scatter(x=m["x"], y=m["y"], mode="markers", customdata=m["custom"],
                                 text=m["text"], hovertemplate="%{text}<extra></extra>",
                                 marker=dict(size=m["size"], color=pairing_color(p), opacity=0),
                                 name=f"{p} edges", legendgroup=p, showlegend=False))
    # Heads without edges (grid layout only): a faint backdrop so the layer x head grid reads.
    present = {n["id"] for n in nodes}
    if head_pos:
        rest = [h for h in all_heads if h not in present and h in head_pos]
        records = {str(n.get("id")): n for n in backdrop}
        if rest:
            fig.add_trace(go.Scatter(
                x=[head_pos[h][0] for h in rest], y=[head_pos[h][1] for h in rest], mode="markers",
                marker=dict(size=BACKDROP_SIZE, color="#e3e6ea", line=dict(color="#c9ced4", width=1),
                            symbol=["diamond" if "KV" in h else "circle" for h in rest]),
                customdata=[["node", h, kv_note(records.get(h, {"id": h}))] for h in rest],
                name="no edge", showlegend=False,
                hovertemplate="%{customdata[1]} (no edge)%{customdata[2]}<extra></extra>"))
    # Nodes: one trace per class (legend explains the colours); hubs get their own star trace.
    by_class: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        cls = classes.get(n["id"]) or n.get("head_class") or ""
        by_class.setdefault(cls, []).append(n)
    colors = class_palette(class_order, by_class)
    named = labelled_nodes(nodes, drawn, [*pinned, *([selected] if selected else []), *highlight])
    hover_edges = edge_lists(drawn, verdicts)
    bottom = min((grid_row(p[1]) for p in pos.values()), default=0)
    order_of = {c: i for i, c in enumerate(colors)}
    ringed = circuit_rings(circuit, where) if circuit else None
    if ringed is not None:
        fig.add_trace(ringed)
    notes = circuit["notes"] if circuit else {}
    for cls in sorted(by_class, key=lambda c: (c == "", order_of.get(c, len(order_of)), c)):
        # The class's legend entry: a circle in its colour (the node traces' glyphs vary: a KV
        # group's diamond, a hub's star, so none of them stands for the class in the legend).
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", hoverinfo="skip",
                                 marker=dict(size=10, color=colors.get(cls, NO_CLASS_COLOR),
                                             symbol=LEGEND_SYMBOL, line=dict(color="white", width=1)),
                                 name=f"{cls or 'no class'} ({len(by_class[cls])})",
                                 legendgroup="class:" + (cls or "-"), showlegend=True, legendrank=2,
                                 meta="class-legend"))
        for hub in (False, True):
            group = [n for n in by_class[cls] if bool(n.get("is_hub")) == hub]
            if not group and hub:
                continue
            fig.add_trace(go.Scatter(
                x=[pos[n["id"]][0] for n in group], y=[pos[n["id"]][1] for n in group],
                mode="markers+text",
                text=[(n["id"] + (" ★ hub" if hub else "")) if n["id"] in named else "" for n in group],
                # Grid layout: labels below the first row, where no edge arrives; above elsewhere.
                textposition=["bottom center" if layout == "grid" and grid_row(pos[n["id"]][1]) == bottom
                              else "top center" for n in group],
                textfont=dict(size=11 if hub else 10, color="#222"),
                cliponaxis=False,  # labels of the top and bottom rows are never cut off
                customdata=[["node", n["id"], n.get("degree", 0), n.get("in_degree", 0),
                             n.get("out_degree", 0), "yes" if hub else "no", cls or "–", kv_note(n),
                             what_note(n), hover_edges.get(str(n["id"]), "") + notes.get(str(n["id"]), "")]
                            for n in group],
                hovertemplate=("<b>%{customdata[1]}</b><br>class: %{customdata[6]}<br>degree %{customdata[2]} "
                               "(in %{customdata[3]}, out %{customdata[4]})<br>hub: %{customdata[5]}"
                               "%{customdata[8]}%{customdata[7]}%{customdata[9]}<extra></extra>"),
                marker=dict(size=[node_size(n) for n in group],
                            color=colors.get(cls, NO_CLASS_COLOR),
                            line=dict(color=["#111" if hub else SINK_COLOR if n.get("sink") else "white"
                                             for n in group],
                                      width=[2.5 if hub or n.get("sink") else 1 for n in group]),
                            symbol=["star" if hub else "diamond" if is_kv_node(n) else "circle" for n in group],
                            opacity=1),
                name=(cls or "no class") + (" (hub)" if hub else ""), legendgroup="class:" + (cls or "-"),
                showlegend=False, legendrank=2))
    found = [(where[n], n) for n in highlight if n in where]
    if found:
        fig.add_trace(go.Scatter(x=[xy[0] for xy, _ in found], y=[xy[1] for xy, _ in found], mode="markers",
                                 marker=dict(size=28, color="rgba(0,0,0,0)", line=dict(color="#d6336c", width=3)),
                                 customdata=[["found", n] for _, n in found], hoverinfo="skip",
                                 name=f"found ({len(found)})", showlegend=True, legendrank=4))
    if selected and selected in pos:
        fig.add_trace(go.Scatter(x=[pos[selected][0]], y=[pos[selected][1]], mode="markers",
                                 marker=dict(size=30, color="rgba(0,0,0,0)",
                                             line=dict(color="#f5a623", width=3)),
                                 hoverinfo="skip", showlegend=False, name="selected"))
    if layout == "grid":
        grid_pos = head_pos or pos
        heads = sorted({int(round(p[0])) for n, p in grid_pos.items() if "KV" not in n})
        rows = sorted({grid_row(p[1]) for p in grid_pos.values()})
        layer_names = data.get("layer_indices") or rows
        has_kv = any("KV" in n for n in list(grid_pos) + list(pos))
        fig.update_xaxes(title="head" + (" (◆ KV group: on its layer, between the query heads it serves)"
                                         if has_kv else ""),
                         tickmode="array", tickvals=heads,
                         ticktext=[f"H{h}" for h in heads], showgrid=False, zeroline=False)
        fig.update_yaxes(title="layer (deeper ↑)", tickmode="array", tickvals=rows,
                         ticktext=[f"L{layer_names[r] if r < len(layer_names) else r}" for r in rows],
                         showgrid=True, zeroline=False, range=[min(rows, default=0) - 0.8,
                                                              max(rows, default=0) + 0.6])
    else:
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False, scaleanchor="x")
    hubs = data.get("hubs", {}).get("hubs", [])
    title = f"Head graph · {data.get('rule', '')} · hub{'s' if len(hubs) != 1 else ''}: {', '.join(hubs) or '–'}"
    fig.update_layout(legend=dict(orientation="v", x=1.01, y=1, bgcolor="rgba(255,255,255,0.8)"),
                      hovermode="closest", clickmode="event", dragmode="pan")
    return base_layout(fig, title, height=height)
