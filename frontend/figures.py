"""Plotly figure builders: pure functions from the API's JSON to ``go.Figure``.

No HTTP and no Dash here, so every figure can be rebuilt for export and tested from JSON alone.
Head names are "L{block}H{head}" as the API writes them.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from headgraph.frontend.graph_layout import Positions

PAIRING_COLORS: dict[str, str] = {"OQ": "#d62728", "OK": "#2ca02c", "OV": "#1f77b4"}
OTHER_PAIRING_COLOR = "#7f7f7f"
CLASS_PALETTE: tuple[str, ...] = ("#9467bd", "#ff7f0e", "#17becf", "#e377c2", "#bcbd22",
                                  "#8c564b", "#1f77b4", "#d62728", "#2ca02c", "#7f7f7f")
NO_CLASS_COLOR = "#8c9bb0"
QUADRANTS: dict[int, tuple[str, str]] = {3: ("both", "#9467bd"), 1: ("PK only", "#d62728"),
                                         2: ("CS only", "#1f77b4"), 0: ("others", "#c7c7c7")}
METRIC_TITLES = {"raw": "PK", "normalized": "normalized PK", "z": "z-score (Haar)", "cs": "CS"}
FONT = dict(family="Inter, Segoe UI, Helvetica, Arial, sans-serif", size=12)
TEMPLATE = "plotly_white"


def _base(fig: go.Figure, title: str, height: int = 520) -> go.Figure:
    fig.update_layout(template=TEMPLATE, font=FONT, height=height,
                      title=dict(text=title, x=0.01, xanchor="left", font=dict(size=15)),
                      margin=dict(l=60, r=20, t=60, b=50))
    return fig


def empty_figure(message: str, height: int = 420) -> go.Figure:
    """A blank figure carrying a centred message (no data yet, or an API error)."""
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=14, color="#666"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _base(fig, "", height)


def pairing_color(pairing: str, alpha: float = 1.0) -> str:
    """Paper colours (OQ red, OK green, OV blue) as rgba with the given opacity."""
    hex_ = PAIRING_COLORS.get(pairing, OTHER_PAIRING_COLOR).lstrip("#")
    r, g, b = (int(hex_[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha:.3f})"


def class_colors(classes: Sequence[str]) -> dict[str, str]:
    """Stable colour per class name (order of first appearance)."""
    return {c: CLASS_PALETTE[i % len(CLASS_PALETTE)] for i, c in enumerate(dict.fromkeys(classes))}


def flatten_grid(grid: list) -> list[list[float | None]]:
    """[L][Hs][L][Ht] nested lists -> [(L*Hs)][(L*Ht)] rows (source-major, as the labels)."""
    return [[v for tl in sh for v in tl] for sl in grid for sh in sl]


def _layer_blocks(labels: Sequence[str]) -> list[tuple[str, int, int]]:
    """(layer name, first index, last index) runs of a flattened head axis."""
    out: list[tuple[str, int, int]] = []
    for i, name in enumerate(labels):
        layer = name.split("H")[0].split("KV")[0]
        if out and out[-1][0] == layer:
            out[-1] = (layer, out[-1][1], i)
        else:
            out.append((layer, i, i))
    return out


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def score_heatmap(grid: dict[str, Any], *, metric: str, hover_grids: dict[str, dict[str, Any]] | None = None,
                  classes: dict[str, str] | None = None) -> go.Figure:
    """Full source-head x target-head grid of one pairing, blocked by layer with layer ticks.

    ``grid`` is a /api/pk or /api/cs answer; ``hover_grids`` adds other metrics to the hover
    (e.g. {"CS": cs_json, "PK": pk_json}); invalid cells are blank.
    """
    src, tgt = grid["source_labels"], grid["target_labels"]
    z = flatten_grid(grid["grid"])
    valid = flatten_grid(grid["valid"])
    z = [[v if ok else None for v, ok in zip(row, vrow)] for row, vrow in zip(z, valid)]
    classes = classes or {}
    extra = {name: flatten_grid(g["grid"]) for name, g in (hover_grids or {}).items()}
    custom = [[[s, t, classes.get(s, "–"), classes.get(t, "–")]
               + [_fmt(extra[n][i][j], 4) for n in extra] for j, t in enumerate(tgt)]
              for i, s in enumerate(src)]
    extra_hover = "".join(f"<br>{n}: %{{customdata[{4 + k}]}}" for k, n in enumerate(extra))
    label = METRIC_TITLES.get(metric, metric)
    fig = go.Figure(go.Heatmap(
        z=z, x=list(tgt), y=list(src), customdata=custom,
        colorscale="Viridis", colorbar=dict(title=dict(text=label, side="right"), thickness=14),
        hoverongaps=False, xgap=0.5, ygap=0.5,
        hovertemplate=("source %{customdata[0]} (%{customdata[2]})<br>target %{customdata[1]} "
                       f"(%{{customdata[3]}})<br>{label}: %{{z:.4g}}{extra_hover}<extra></extra>")))
    for axis, labels in (("x", tgt), ("y", src)):
        blocks = _layer_blocks(labels)
        ticks = dict(type="category", tickmode="array", tickvals=[(a + b) / 2 for _, a, b in blocks],
                     ticktext=[name for name, _, _ in blocks], showgrid=False, zeroline=False)
        if axis == "x":
            fig.update_xaxes(title=f"target head ({grid['target_role']})", **ticks)
        else:
            fig.update_yaxes(title=f"source head ({grid['source_role']})", autorange="reversed", **ticks)
        for _, a, _ in blocks[1:]:
            line = dict(type="line", line=dict(color="white", width=2), layer="above")
            if axis == "x":
                fig.add_shape(x0=a - 0.5, x1=a - 0.5, y0=-0.5, y1=len(src) - 0.5, **line)
            else:
                fig.add_shape(y0=a - 0.5, y1=a - 0.5, x0=-0.5, x1=len(tgt) - 0.5, **line)
    fig.update_layout(plot_bgcolor="#f1f3f6")
    title = f"{grid['pairing']}: {label} of every (source, target) head pair ({grid['model']}, {grid['order']})"
    if grid.get("kind") == "cs":
        title = f"CS mode {grid['target_role']}: Composition Score ({grid['model']}, {grid['order']})"
    return _base(fig, title, height=560)


def head_slice(grid: dict[str, Any], head: str, direction: str) -> tuple[list[list[float | None]], list[int], int]:
    """A head's outgoing (as source) or incoming (as target) scores as [layer][head] rows.

    Returns (rows, layer block numbers, heads per row); invalid cells are None.
    """
    labels = grid["source_labels"] if direction == "out" else grid["target_labels"]
    layers = grid["layer_indices"]
    if head not in labels:
        raise KeyError(f"{head} is not on the {direction} axis")
    idx = labels.index(head)
    n_src = len(grid["source_labels"]) // len(layers)
    n_tgt = len(grid["target_labels"]) // len(layers)
    g, v = grid["grid"], grid["valid"]
    if direction == "out":
        sl, sh = divmod(idx, n_src)
        rows = [[g[sl][sh][tl][th] if v[sl][sh][tl][th] else None for th in range(n_tgt)]
                for tl in range(len(layers))]
        return rows, layers, n_tgt
    tl, th = divmod(idx, n_tgt)
    rows = [[g[sl][sh][tl][th] if v[sl][sh][tl][th] else None for sh in range(n_src)]
            for sl in range(len(layers))]
    return rows, layers, n_src


def head_grid_figure(grid: dict[str, Any], head: str, direction: str, *, metric: str) -> go.Figure:
    """Layer x head grid of one head's outgoing or incoming scores (deeper layers higher)."""
    rows, layers, n = head_slice(grid, head, direction)
    label = METRIC_TITLES.get(metric, metric)
    other = "target" if direction == "out" else "source"
    # Categorical axes: a click reports x="H3", y="L1", i.e. the head name "L1H3".
    fig = go.Figure(go.Heatmap(
        z=rows, x=[f"H{h}" for h in range(n)], y=[f"L{layer}" for layer in layers],
        colorscale="Viridis", hoverongaps=False, xgap=1, ygap=1,
        colorbar=dict(title=dict(text=label, side="right"), thickness=14),
        hovertemplate=f"{other} %{{y}}%{{x}}<br>{label}: %{{z:.4g}}<extra></extra>"))
    fig.update_xaxes(title=f"{other} head", type="category", showgrid=False, zeroline=False)
    fig.update_yaxes(title=f"{other} layer", type="category", showgrid=False, zeroline=False)
    fig.update_layout(plot_bgcolor="#f1f3f6")
    arrow = "→ later heads" if direction == "out" else "← earlier heads"
    return _base(fig, f"{head} {arrow} ({grid['pairing']}, {label})", height=320)


def _offset(p0: tuple[float, float], p1: tuple[float, float], shift: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """Segment p0-p1 moved sideways by ``shift`` (so parallel pairings stay apart)."""
    dx, dy = p1[0] - p0[0], p1[1] - p0[1]
    norm = math.hypot(dx, dy) or 1.0
    ox, oy = -dy / norm * shift, dx / norm * shift
    return (p0[0] + ox, p0[1] + oy), (p1[0] + ox, p1[1] + oy)


def graph_figure(data: dict[str, Any], pos: Positions, *, layout: str,
                 classes: dict[str, str] | None = None, all_heads: Sequence[str] = (),
                 head_pos: Positions | None = None, selected: str | None = None,
                 selected_edge: tuple[str, str, str] | None = None) -> go.Figure:
    """The head graph: edges coloured by pairing with opacity = score / max, hubs marked.

    Each edge gets an invisible marker on it (customdata ["edge", source, target, pairing]) so it
    can be hovered and clicked; nodes carry customdata ["node", name].
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
        m["text"].append(f"{p} {s} → {t}<br>PK {_fmt(e.get('score'))} · normalized "
                         f"{_fmt(e.get('normalized'))}<br>CS {_fmt(e.get('cs'))} · rank {e.get('rank', '–')}"
                         f"<br>opacity {_fmt(e.get('opacity'))}")
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
        if rest:
            fig.add_trace(go.Scatter(
                x=[head_pos[h][0] for h in rest], y=[head_pos[h][1] for h in rest], mode="markers",
                marker=dict(size=7, color="#e3e6ea", line=dict(color="#c9ced4", width=1)),
                customdata=[["node", h] for h in rest], name="no edge", showlegend=False,
                hovertemplate="%{customdata[1]} (no edge)<extra></extra>"))
    # Nodes: one trace per class (legend explains the colours); hubs get their own star trace.
    by_class: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        cls = classes.get(n["id"]) or n.get("head_class") or ""
        by_class.setdefault(cls, []).append(n)
    colors = class_colors(sorted(c for c in by_class if c))
    show_all_text = len(nodes) <= 48
    bottom = min((p[1] for p in pos.values()), default=0.0)
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
                textposition=["bottom center" if layout == "grid" and pos[n["id"]][1] == bottom else "top center"
                              for n in group],
                textfont=dict(size=11 if hub else 10, color="#222"),
                customdata=[["node", n["id"], n.get("degree", 0), n.get("in_degree", 0),
                             n.get("out_degree", 0), "yes" if hub else "no", cls or "–"] for n in group],
                hovertemplate=("%{customdata[1]}<br>class: %{customdata[6]}<br>degree %{customdata[2]} "
                               "(in %{customdata[3]}, out %{customdata[4]})<br>hub: %{customdata[5]}"
                               "<extra></extra>"),
                marker=dict(size=[(16 if hub else 10) + 5 * math.sqrt(float(n.get("degree", 0))) for n in group],
                            color=colors.get(cls, NO_CLASS_COLOR),
                            line=dict(color="#111" if hub else "white", width=2.5 if hub else 1),
                            symbol="star" if hub else "circle", opacity=1),
                name=(cls or "no class") + (" (hub)" if hub else ""), legendgroup="class:" + (cls or "-"),
                showlegend=not hub, legendrank=2))
    if selected and selected in pos:
        fig.add_trace(go.Scatter(x=[pos[selected][0]], y=[pos[selected][1]], mode="markers",
                                 marker=dict(size=30, color="rgba(0,0,0,0)",
                                             line=dict(color="#f5a623", width=3)),
                                 hoverinfo="skip", showlegend=False, name="selected"))
    if layout == "grid":
        heads = sorted({int(round(p[0])) for p in (head_pos or pos).values()})
        rows = sorted({int(round(p[1])) for p in (head_pos or pos).values()})
        layer_names = data.get("layer_indices") or rows
        fig.update_xaxes(title="head", tickmode="array", tickvals=heads,
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
    fig = _base(fig, title, height=600)
    fig.update_layout(legend=dict(orientation="v", x=1.01, y=1, bgcolor="rgba(255,255,255,0.8)"),
                      hovermode="closest", clickmode="event", dragmode="pan")
    return fig


def top_cutoffs(points: dict[str, Any]) -> tuple[float | None, float | None]:
    """Where the top-x% sets start: the lowest PK among the API's PK-top quadrants (1, 3) and
    the lowest CS among its CS-top quadrants (2, 3)."""
    quad = points.get("quadrant") or []
    pk_top = [v for v, q in zip(points["pk"], quad) if q in (1, 3)]
    cs_top = [v for v, q in zip(points["cs"], quad) if q in (2, 3)]
    return (min(pk_top) if pk_top else None, min(cs_top) if cs_top else None)


def scatter_figure(data: dict[str, Any]) -> go.Figure:
    """PK vs CS per pair (paper Fig. 5): quadrant colours, top-x% cutoff lines, Spearman rho."""
    pts = data["points"]
    cmp_ = data.get("comparison", {})
    quad = pts.get("quadrant") or [0] * len(pts["pk"])
    fig = go.Figure()
    for code in (0, 2, 1, 3):
        name, color = QUADRANTS[code]
        idx = [i for i, q in enumerate(quad) if q == code]
        trace = go.Scattergl if len(quad) > 5000 else go.Scatter
        fig.add_trace(trace(
            x=[pts["cs"][i] for i in idx], y=[pts["pk"][i] for i in idx], mode="markers",
            name=f"{name} ({len(idx)})",
            customdata=[[pts["source"][i], pts["target"][i]] for i in idx],
            marker=dict(size=7 if code else 5, color=color, opacity=0.9 if code else 0.55,
                        line=dict(width=0)),
            hovertemplate="%{customdata[0]} → %{customdata[1]}<br>PK %{y:.4g}<br>CS %{x:.4g}<extra>"
                          + name + "</extra>"))
    pk_cut, cs_cut = top_cutoffs(pts)
    if pk_cut is not None:
        fig.add_hline(y=pk_cut, line=dict(color="#d62728", dash="dash", width=1.2),
                      annotation_text=f"top {data['top_percent']:g}% PK", annotation_position="top left")
    if cs_cut is not None:
        fig.add_vline(x=cs_cut, line=dict(color="#1f77b4", dash="dash", width=1.2),
                      annotation_text=f"top {data['top_percent']:g}% CS", annotation_position="top right")
    rho_all, rho_top = cmp_.get("rho_all"), cmp_.get("rho_top")
    fig.update_xaxes(title=f"Composition Score (mode {data.get('mode', '')})")
    fig.update_yaxes(title=f"PK ({data['pairing']})")
    title = (f"{data['pairing']}: PK vs CS · Spearman ρ all = {_fmt(rho_all)}, "
             f"top set = {_fmt(rho_top)}")
    fig = _base(fig, title, height=560)
    fig.update_layout(legend=dict(title="quadrant"), clickmode="event")
    return fig


def kl_grid_figure(kl: dict[str, Any], selected: str | None = None) -> go.Figure:
    """4 x 4 KL(random || model) grid over (source role, target role), numbers in the cells."""
    roles = kl["roles"]
    z = kl["kl"]
    text = [[_fmt(v, 3) for v in row] for row in z]
    custom = [[s + t for t in roles] for s in roles]
    fig = go.Figure(go.Heatmap(z=z, x=roles, y=roles, text=text, texttemplate="%{text}",
                               customdata=custom, colorscale="Blues",
                               colorbar=dict(title=dict(text="KL", side="right"), thickness=12),
                               hovertemplate="%{customdata}: KL = %{z:.4g}<extra></extra>",
                               xgap=2, ygap=2))
    if selected and len(selected) == 2 and selected[0] in roles and selected[1] in roles:
        i, j = roles.index(selected[0]), roles.index(selected[1])
        fig.add_shape(type="rect", x0=j - 0.5, x1=j + 0.5, y0=i - 0.5, y1=i + 0.5,
                      line=dict(color="#f5a623", width=3))
    fig.update_xaxes(title="target role", side="bottom")
    fig.update_yaxes(title="source role", autorange="reversed", scaleanchor="x")
    return _base(fig, "KL(random ‖ model) per role pairing", height=430)


def reference_figure(kl: dict[str, Any], pairing: str, null: dict[str, Any] | None = None) -> go.Figure:
    """Histogram of the model's PK vs the Haar random density with both means (paper Fig. 8).

    ``null`` (anisotropy-aware null summary with mean/std) is drawn as a dotted line.
    """
    h = kl["histograms"].get(pairing)
    if h is None:
        return empty_figure(f"no valid pairs for {pairing}")
    edges = h["bin_edges"]
    centers = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
    widths = [b - a for a, b in zip(edges[:-1], edges[1:])]
    model_d, random_d = h["model_density"], h["random_density"]
    if len(model_d) == len(edges):  # densities given on the grid points themselves
        centers, widths = edges, [edges[1] - edges[0]] * len(edges)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=centers, y=model_d, width=widths, name=f"model ({h['n_pairs']} pairs)",
                         marker=dict(color=pairing_color(pairing, 0.55)), hovertemplate="PK %{x:.3g}: %{y:.3g}<extra>model</extra>"))
    fig.add_trace(go.Scatter(x=centers, y=random_d, mode="lines", name="random (Haar)",
                             line=dict(color="#333", width=2), hovertemplate="PK %{x:.3g}: %{y:.3g}<extra>random</extra>"))
    fig.add_vline(x=h["model_mean"], line=dict(color=pairing_color(pairing), width=2),
                  annotation_text=f"model mean {h['model_mean']:.3g}", annotation_position="top right")
    fig.add_vline(x=h["random_mean"], line=dict(color="#333", width=2, dash="dash"),
                  annotation_text=f"random mean {h['random_mean']:.3g}", annotation_position="top left")
    if null and null.get("mean") is not None:
        mu, sd = float(null["mean"]), float(null.get("std") or 0.0)
        if sd > 0:
            xs = [edges[0] + (edges[-1] - edges[0]) * i / 200 for i in range(201)]
            ys = [math.exp(-0.5 * ((x - mu) / sd) ** 2) / (sd * math.sqrt(2 * math.pi)) for x in xs]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="anisotropic null (normal approx.)",
                                     line=dict(color="#9467bd", width=2, dash="dot"),
                                     hovertemplate="PK %{x:.3g}: %{y:.3g}<extra>anisotropic null</extra>"))
        fig.add_vline(x=mu, line=dict(color="#9467bd", width=1.5, dash="dot"),
                      annotation_text=f"anisotropic null mean {mu:.3g}", annotation_position="bottom right")
    fig.update_xaxes(title=f"PK ({pairing})")
    fig.update_yaxes(title="density")
    fig = _base(fig, f"{pairing}: model PK vs random subspaces (d_model {kl['d_model']}, rank {kl['rank']})",
                height=430)
    fig.update_layout(legend=dict(x=0.99, xanchor="right", y=0.9), bargap=0)
    return fig


def null_summary(nulls: dict[str, Any], pairing: str) -> dict[str, Any] | None:
    """The anisotropic null summary (mean, std, quantiles) of one pairing, if the API has it."""
    entry = nulls.get(pairing) if isinstance(nulls, dict) else None
    if not isinstance(entry, dict):
        return None
    summary = entry.get("summary", entry)
    return summary if summary.get("mean") is not None else None


def null_figure(nulls: dict[str, Any], haar: dict[str, Any] | None = None) -> go.Figure:
    """Per pairing: Haar mean ± std next to the anisotropy-aware null mean ± std (and its 95%)."""
    summaries = {p: null_summary(nulls, p) for p in nulls}
    summaries = {p: s for p, s in summaries.items() if s}
    names = list(summaries)
    if not names:
        return empty_figure("no anisotropic null computed for this model", 300)
    xs = list(range(len(names)))
    fig = go.Figure()
    if haar and haar.get("mean") is not None:
        fig.add_trace(go.Scatter(x=[x - 0.12 for x in xs], y=[haar["mean"]] * len(names), mode="markers",
                                 name="Haar (isotropic) mean ± std",
                                 error_y=dict(type="data", array=[haar.get("std") or 0] * len(names),
                                              color="#555", thickness=1.5, width=6),
                                 marker=dict(color="#555", size=10, symbol="diamond")))
    fig.add_trace(go.Scatter(x=[x + 0.12 for x in xs], y=[summaries[p]["mean"] for p in names], mode="markers",
                             name="anisotropic null mean ± std",
                             error_y=dict(type="data", array=[summaries[p].get("std") or 0 for p in names],
                                          color="#9467bd", thickness=1.5, width=6),
                             marker=dict(color=[pairing_color(p) for p in names], size=11,
                                         line=dict(color="#9467bd", width=2))))
    q95 = [(summaries[p].get("quantiles") or {}).get("0.95") for p in names]
    if any(v is not None for v in q95):
        fig.add_trace(go.Scatter(x=[x + 0.12 for x in xs], y=q95, mode="markers", name="anisotropic null 95%",
                                 marker=dict(symbol="line-ew", size=18, line=dict(color="#9467bd", width=2.5))))
    fig.update_xaxes(tickmode="array", tickvals=xs, ticktext=names, range=[-0.6, len(names) - 0.4])
    fig.update_yaxes(title="PK under the null")
    fig = _base(fig, "Nulls per pairing: random planes in isotropic R^d vs planes drawn where this "
                     "model's weights live (anisotropic)", height=340)
    fig.update_layout(legend=dict(orientation="h", y=-0.18))
    return fig


def patterns_figure(patterns: dict[str, Any], classes: dict[str, str] | None = None) -> go.Figure:
    """One layer x head heatmap per attention-pattern score (identity, previous token, ...)."""
    kinds = patterns["kinds"]
    layers = patterns["layer_indices"]
    fig = make_subplots(rows=1, cols=len(kinds), subplot_titles=[k.replace("_", " ") for k in kinds],
                        horizontal_spacing=0.025, shared_yaxes=True)
    for c, kind in enumerate(kinds, start=1):
        z = patterns["scores"][kind]
        n = len(z[0]) if z else 0
        names = [[f"L{layer}H{h}" for h in range(n)] for layer in layers]
        fig.add_trace(go.Heatmap(z=z, x=list(range(n)), y=list(range(len(layers))), zmin=0, zmax=1,
                                 coloraxis="coloraxis", customdata=names, xgap=1, ygap=1,
                                 hovertemplate=f"%{{customdata}}<br>{kind}: %{{z:.3f}}<extra></extra>"),
                      row=1, col=c)
        fig.update_xaxes(tickmode="array", tickvals=list(range(0, n, max(1, n // 8))),
                         ticktext=[f"H{h}" for h in range(0, n, max(1, n // 8))], row=1, col=c)
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(layers))),
                     ticktext=[f"L{layer}" for layer in layers], row=1, col=1)
    fig.update_layout(coloraxis=dict(colorscale="Magma", cmin=0, cmax=1,
                                     colorbar=dict(title=dict(text="score", side="right"), thickness=12)))
    return _base(fig, "Attention-pattern scores per head (identity and pattern scores, Fig. 7)",
                 height=max(260, 120 + 36 * len(layers)))


def token_grid_figure(tokens: dict[str, Any], layers: Sequence[int], n_heads: int,
                      shown: int = 3) -> go.Figure:
    """Top tokens of each head's role subspace in a layer x head grid (paper Fig. 6).

    Cell colour = top-1 score; cell text = the ``shown`` best tokens.
    """
    rows = {(h["layer"], h["head"]): h for h in tokens["heads"]}
    z, text, hover = [], [], []
    for layer in layers:
        zr, tr, hr = [], [], []
        for head in range(n_heads):
            h = rows.get((layer, head))
            toks = h["tokens"] if h else []
            zr.append(toks[0]["score"] if toks else None)
            tr.append("<br>".join(t.get("display", t.get("text", "")) for t in toks[:shown]))
            hr.append(f"{h['name'] if h else ''}<br>" + "<br>".join(
                f"{t.get('display', t.get('text', ''))}  {t['score']:.3f}" for t in toks))
        z.append(zr)
        text.append(tr)
        hover.append(hr)
    fig = go.Figure(go.Heatmap(z=z, x=list(range(n_heads)), y=list(range(len(layers))), text=text,
                               texttemplate="%{text}", textfont=dict(size=10), customdata=hover,
                               hovertemplate="%{customdata}<extra></extra>", colorscale="YlGnBu",
                               xgap=2, ygap=2,
                               colorbar=dict(title=dict(text="top score", side="right"), thickness=12)))
    fig.update_xaxes(title="head", tickmode="array", tickvals=list(range(n_heads)),
                     ticktext=[f"H{h}" for h in range(n_heads)], showgrid=False)
    fig.update_yaxes(title="layer (deeper ↑)", tickmode="array", tickvals=list(range(len(layers))),
                     ticktext=[f"L{layer}" for layer in layers], showgrid=False)
    return _base(fig, f"Top tokens of each head's {tokens['role']} subspace (fraction of the centred "
                      "unembedding vector inside the subspace)", height=max(300, 150 + 70 * len(layers)))


def cosines_figure(pair: dict[str, Any]) -> go.Figure:
    """Principal-angle cosines of one head pair, descending (PK = sum of their squares)."""
    cos = pair["cosines"]
    fig = go.Figure(go.Bar(x=list(range(1, len(cos) + 1)), y=cos,
                           marker=dict(color=pairing_color(pair["pairing"], 0.8)),
                           hovertemplate="cos θ%{x} = %{y:.4f}<extra></extra>"))
    fig.update_xaxes(title="principal angle", dtick=max(1, len(cos) // 8))
    fig.update_yaxes(title="cosine", range=[0, 1])
    fig = _base(fig, f"principal cosines · PK = Σcos² = {pair['pk']:.4g}", height=260)
    fig.update_layout(margin=dict(l=50, r=10, t=40, b=40))
    return fig
