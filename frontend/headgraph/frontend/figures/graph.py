"""The head graph figure: heads as nodes (coloured by class, hubs starred), edges coloured by pairing.

Edges carry invisible click handles so Dash callbacks can open an edge's detail panel.
"""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Sequence

import plotly.graph_objects as go

from headgraph.frontend.figures.common import NO_CLASS_COLOR, base_layout, class_colors, fmt_value, pairing_color
from headgraph.frontend.graph_layout import KV_ROW_OFFSET, Positions, is_kv_node

KV_NOTE = (f"<br>KV group: shared keys/values of %s<br>(drawn {KV_ROW_OFFSET:g} row under "
           "its layer, at the mean column of those query heads)")


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


def graph_figure(data: dict[str, Any], pos: Positions, *, layout: str,
                 classes: dict[str, str] | None = None, all_heads: Sequence[str] = (),
                 head_pos: Positions | None = None, selected: str | None = None,
                 selected_edge: tuple[str, str, str] | None = None,
                 backdrop: Sequence[dict[str, Any]] = ()) -> go.Figure:
    """The head graph: edges coloured by pairing with opacity = score / max, hubs marked.

    Each edge gets an invisible marker on it (customdata ["edge", source, target, pairing]) so it
    can be hovered and clicked; nodes carry customdata ["node", name]. A grouped-query model's
    KV-group nodes (L6KV1) are diamonds whose hover names the query heads they serve; in the
    grid layout they sit on a sub-row under those heads (graph_layout.grid_positions).
    ``backdrop``: node records of ``all_heads`` (their KV members for the hover).
    """
    g = data["graph"]
    nodes = g.get("nodes", [])
    edges = g.get("edges", g.get("links", []))
    classes = classes or {}
    span = max((abs(x) for p in pos.values() for x in p), default=1.0) or 1.0
    shift = {"OQ": -1, "OK": 0, "OV": 1}
    step = 0.045 * (1.0 if layout == "grid" else span)
    fig = go.Figure()
    # Edges: one trace per (pairing, opacity bucket) keeps the trace count bounded.
    buckets: dict[tuple[str, int], tuple[list[float | None], list[float | None]]] = {}
    mids: dict[str, dict[str, list[Any]]] = {}
    # Click handles sit at a fraction of the edge that depends on the source node, so edges that
    # cross at their midpoints (same layer pair, same head sum) still get distinct handles.
    order = {n: i for i, n in enumerate(sorted(pos, key=lambda n: (pos[n][1], pos[n][0], n)))}
    for e in edges:
        s, t, p = e["source"], e["target"], e.get("pairing", e.get("key", ""))
        if s not in pos or t not in pos:
            continue
        a, b = _offset(pos[s], pos[t], shift.get(p, 0) * step)
        alpha_bucket = max(1, min(10, round(float(e.get("opacity", 1.0)) * 10)))
        xs, ys = buckets.setdefault((p, alpha_bucket), ([], []))
        xs += [a[0], b[0], None]
        ys += [a[1], b[1], None]
        m = mids.setdefault(p, {"x": [], "y": [], "custom": [], "text": []})
        frac = 0.3 + 0.4 * order[s] / max(1, len(order) - 1)
        m["x"].append(a[0] + frac * (b[0] - a[0]))
        m["y"].append(a[1] + frac * (b[1] - a[1]))
        m["custom"].append(["edge", s, t, p])
        m["text"].append(f"{p} {s} → {t}<br>PK {fmt_value(e.get('score'))} · normalized "
                         f"{fmt_value(e.get('normalized'))}<br>CS {fmt_value(e.get('cs'))} · "
                         f"rank {e.get('rank', '–')}<br>opacity {fmt_value(e.get('opacity'))}")
    pairings = list(dict.fromkeys(list(data.get("pairings", [])) + [p for p, _ in sorted(buckets)]))
    counts = data.get("edge_counts", {})
    for p in pairings:
        first = True
        for (bp, bucket), (xs, ys) in sorted(buckets.items()):
            if bp != p:
                continue
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip",
                                     line=dict(color=pairing_color(p, bucket / 10), width=2.2),
                                     name=f"{p} ({counts.get(p, '')})", legendgroup=p,
                                     showlegend=first, legendrank=1))
            first = False
    if selected_edge and selected_edge[0] in pos and selected_edge[1] in pos:
        s, t, p = selected_edge
        a, b = _offset(pos[s], pos[t], shift.get(p, 0) * step)
        fig.add_trace(go.Scatter(x=[a[0], b[0]], y=[a[1], b[1]], mode="lines", hoverinfo="skip",
                                 line=dict(color="rgba(245,166,35,0.55)", width=9), showlegend=False,
                                 name="selected edge"))
    for p, m in mids.items():
        fig.add_trace(go.Scatter(x=m["x"], y=m["y"], mode="markers", customdata=m["custom"],
                                 text=m["text"], hovertemplate="%{text}<extra></extra>",
                                 marker=dict(size=14, color=pairing_color(p), opacity=0),
                                 name=f"{p} edges", legendgroup=p, showlegend=False))
    # Heads without edges (grid layout only): a faint backdrop so the layer x head grid reads.
    present = {n["id"] for n in nodes}
    if head_pos:
        rest = [h for h in all_heads if h not in present and h in head_pos]
        records = {str(n.get("id")): n for n in backdrop}
        if rest:
            fig.add_trace(go.Scatter(
                x=[head_pos[h][0] for h in rest], y=[head_pos[h][1] for h in rest], mode="markers",
                marker=dict(size=7, color="#e3e6ea", line=dict(color="#c9ced4", width=1),
                            symbol=["diamond" if "KV" in h else "circle" for h in rest]),
                customdata=[["node", h, kv_note(records.get(h, {"id": h}))] for h in rest],
                name="no edge", showlegend=False,
                hovertemplate="%{customdata[1]} (no edge)%{customdata[2]}<extra></extra>"))
    # Nodes: one trace per class (legend explains the colours); hubs get their own star trace.
    by_class: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        cls = classes.get(n["id"]) or n.get("head_class") or ""
        by_class.setdefault(cls, []).append(n)
    colors = class_colors(sorted(c for c in by_class if c))
    show_all_text = len(nodes) <= 48
    bottom = min((round(p[1]) for p in pos.values()), default=0)  # KV sub-rows count as their row
    for cls in sorted(by_class, key=lambda c: (c == "", c)):
        for hub in (False, True):
            group = [n for n in by_class[cls] if bool(n.get("is_hub")) == hub]
            if not group and hub:
                continue
            fig.add_trace(go.Scatter(
                x=[pos[n["id"]][0] for n in group], y=[pos[n["id"]][1] for n in group],
                mode="markers+text",
                text=[(n["id"] + (" ★ hub" if hub else "")) if (show_all_text or hub) else "" for n in group],
                # Grid layout: labels below the first row, where no edge arrives; above elsewhere.
                textposition=["bottom center" if layout == "grid" and round(pos[n["id"]][1]) == bottom
                              else "top center" for n in group],
                textfont=dict(size=11 if hub else 10, color="#222"),
                cliponaxis=False,  # labels of the top and bottom rows are never cut off
                customdata=[["node", n["id"], n.get("degree", 0), n.get("in_degree", 0),
                             n.get("out_degree", 0), "yes" if hub else "no", cls or "–", kv_note(n)]
                            for n in group],
                hovertemplate=("%{customdata[1]}<br>class: %{customdata[6]}<br>degree %{customdata[2]} "
                               "(in %{customdata[3]}, out %{customdata[4]})<br>hub: %{customdata[5]}"
                               "%{customdata[7]}<extra></extra>"),
                marker=dict(size=[(16 if hub else 10) + 5 * math.sqrt(float(n.get("degree", 0))) for n in group],
                            color=colors.get(cls, NO_CLASS_COLOR),
                            line=dict(color="#111" if hub else "white", width=2.5 if hub else 1),
                            symbol=["star" if hub else "diamond" if is_kv_node(n) else "circle" for n in group],
                            opacity=1),
                name=(cls or "no class") + (" (hub)" if hub else ""), legendgroup="class:" + (cls or "-"),
                showlegend=not hub, legendrank=2))
    if selected and selected in pos:
        fig.add_trace(go.Scatter(x=[pos[selected][0]], y=[pos[selected][1]], mode="markers",
                                 marker=dict(size=30, color="rgba(0,0,0,0)",
                                             line=dict(color="#f5a623", width=3)),
                                 hoverinfo="skip", showlegend=False, name="selected"))
    if layout == "grid":
        grid_pos = head_pos or pos
        heads = sorted({int(round(p[0])) for n, p in grid_pos.items() if "KV" not in n})
        rows = sorted({int(round(p[1])) for p in grid_pos.values()})
        layer_names = data.get("layer_indices") or rows
        has_kv = any("KV" in n for n in list(grid_pos) + list(pos))
        fig.update_xaxes(title="head" + (" (◆ KV group: under the query heads it serves)" if has_kv else ""),
                         tickmode="array", tickvals=heads,
                         ticktext=[f"H{h}" for h in heads], showgrid=False, zeroline=False)
        fig.update_yaxes(title="layer (deeper ↑)", tickmode="array", tickvals=rows,
                         ticktext=[f"L{layer_names[r] if r < len(layer_names) else r}" for r in rows],
                         showgrid=True, zeroline=False, range=[min(rows, default=0) - 0.5,
                                                              max(rows, default=0) + 0.6])
    else:
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False, scaleanchor="x")
    hubs = data.get("hubs", {}).get("hubs", [])
    title = f"Head graph · {data.get('rule', '')} · hub{'s' if len(hubs) != 1 else ''}: {', '.join(hubs) or '–'}"
    fig = base_layout(fig, title, height=600)
    fig.update_layout(legend=dict(orientation="v", x=1.01, y=1, bgcolor="rgba(255,255,255,0.8)"),
                      hovermode="closest", clickmode="event", dragmode="pan")
    return fig
