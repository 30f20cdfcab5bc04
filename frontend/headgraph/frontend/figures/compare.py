"""Figures of the compare and timeline views: pure functions of GET /api/compare and
GET /api/timeline JSON (and /api/pk for a checkpoint's grid).

``compare_heatmaps``: A, B and B - A side by side (source heads x target heads, blocked by
layer); ``compare_graph``: A's and B's top-k edges side by side on a layer x head grid and
the change, coloured by gained / lost / kept, hubs starred; ``timeline_figure``: one PK line per edge over the steps,
the shown checkpoint marked.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from headgraph.frontend.api.answers import CompareOut, EdgeChangeOut, ScoreGrid, TimelineOut
from headgraph.frontend.figures.common import base_layout, empty_figure
from headgraph.frontend.figures.heatmaps import flatten_grid

STATUS_STYLE = {  # edge status -> (colour, dash, legend name)
    "gained": ("#1a9850", "solid", "gained (B's top-k only)"),
    "lost": ("#d73027", "dash", "lost (A's top-k only)"),
    "kept": ("#7f7f7f", "solid", "kept (both)"),
}
TRAJECTORY_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d",
                     "#666666", "#1f78b4", "#b2df8a")


def masked_grid(grid: list, valid: list) -> list[list[float | None]]:
    """[L][Hs][L][Ht] values and validity -> flattened rows, None where not valid."""
    return [[v if ok else None for v, ok in zip(row, vrow)]
            for row, vrow in zip(flatten_grid(grid), flatten_grid(valid))]


def cropped(grids: list[list[list[float | None]]], rows: list[str], cols: list[str]
            ) -> tuple[list[list[list[float | None]]], list[str], list[str]]:
    """The grids without the rows and columns that hold no value in any of them (heads that
    are never a valid source or target: a forward grid's last layer as source, first as
    target)."""
    keep_r = [i for i in range(len(rows)) if any(g[i][j] is not None for g in grids for j in range(len(cols)))]
    keep_c = [j for j in range(len(cols)) if any(g[i][j] is not None for g in grids for i in range(len(rows)))]
    return ([[[g[i][j] for j in keep_c] for i in keep_r] for g in grids], [rows[i] for i in keep_r],
            [cols[j] for j in keep_c])


def compare_heatmaps(data: CompareOut) -> go.Figure:
    """A | B | B - A heatmaps of the compared metric (null cells: not a valid pair in both;
    rows and columns with no valid pair left out)."""
    grids, src, tgt = cropped([flatten_grid(data[k]) for k in ("grid_a", "grid_b", "diff")],
                              data["source_labels"], data["target_labels"])
    shown = [v for g in grids[:2] for row in g for v in row if v is not None]
    lo, hi = (min(shown), max(shown)) if shown else (0.0, 1.0)
    diffs = [abs(v) for row in grids[2] for v in row if v is not None]
    span = max(diffs) if diffs else 1.0
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08, subplot_titles=(
        f"A: {data['a']}", f"B: {data['b']}", "B − A"))
    for i, g in enumerate(grids):
        diff = i == 2
        fig.add_trace(go.Heatmap(
            z=g, x=tgt, y=src, zmin=-span if diff else lo, zmax=span if diff else hi,
            colorscale="RdBu" if diff else "Viridis", reversescale=diff, showscale=i != 0,
            colorbar=dict(x=1.01 if diff else 0.645, xanchor="left", len=0.9, thickness=10,
                          title=dict(text="B − A" if diff else data["metric"])),
            name=("A", "B", "B − A")[i], hoverongaps=False,
            hovertemplate="%{y} → %{x}<br>%{z:.3f}<extra>" + ("A", "B", "B − A")[i] + "</extra>"),
            row=1, col=i + 1)
        fig.update_yaxes(autorange="reversed", row=1, col=i + 1, showticklabels=i == 0)
    fig.update_xaxes(tickangle=-90)
    return base_layout(fig, f"{data['pairing']} {data['metric']}: A, B and B − A", height=460)


def _position(name: str, layer_of: dict[int, int]) -> tuple[float, float]:
    """Grid position of a head name: x = head (KV groups half a step over), y = layer row."""
    body = name[1:]
    kv = "KV" in body
    layer, head = (body.split("KV") if kv else body.split("H"))
    return int(head) + (0.5 if kv else 0.0), -layer_of.get(int(layer), int(layer))


def _edge_traces(fig: go.Figure, edges: list[EdgeChangeOut], layer_of: dict[int, int], col: int, *,
                 name: str, group: str, color: str, dash: str, width: float, legend: bool) -> None:
    """One line trace of ``edges`` and one trace of hover markers at their midpoints."""
    xs: list[float | None] = []
    ys: list[float | None] = []
    mx: list[float] = []
    my: list[float] = []
    text = []
    for e in edges:
        (x0, y0), (x1, y1) = _position(e["source"], layer_of), _position(e["target"], layer_of)
        xs += [x0, x1, None]
        ys += [y0, y1, None]
        mx.append((x0 + x1) / 2)
        my.append((y0 + y1) / 2)
        text.append(f"{e['source']} → {e['target']}<br>A {e['a']:.3f} · B {e['b']:.3f} · "
                    f"B − A {e['delta']:+.3f}<br>rank A {e['rank_a'] or '–'} · rank B {e['rank_b'] or '–'}")
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=name, line=dict(color=color, dash=dash, width=width),
                             hoverinfo="skip", legendgroup=group, showlegend=legend), row=1, col=col)
    fig.add_trace(go.Scatter(x=mx, y=my, mode="markers", marker=dict(size=9, color=color, opacity=0.35),
                             text=text, hovertemplate="%{text}<extra></extra>", showlegend=False,
                             legendgroup=group, name=group, customdata=[group] * len(mx)), row=1, col=col)


def _node_trace(fig: go.Figure, names: list[str], hubs: dict[str, str], layer_of: dict[int, int], col: int,
                legend: bool) -> None:
    """The heads of a panel; hubs (name -> hover note) drawn as stars."""
    pos = [_position(n, layer_of) for n in names]
    fig.add_trace(go.Scatter(
        x=[p[0] for p in pos], y=[p[1] for p in pos], mode="markers+text", text=names,
        textposition="top center", name="heads (★ hub)", customdata=names, showlegend=legend,
        legendgroup="heads",
        marker=dict(size=[18 if n in hubs else 10 for n in names],
                    symbol=["star" if n in hubs else "circle" for n in names],
                    color=["#f0a30a" if n in hubs else "#4c72b0" for n in names],
                    line=dict(width=1, color="#333")),
        hovertext=[f"{n}: {hubs[n]}" if n in hubs else n for n in names],
        hovertemplate="%{hovertext}<extra></extra>"), row=1, col=col)


def compare_graph(data: CompareOut) -> go.Figure:
    """Side by side on a layer x head grid: A's top-k edges, B's top-k edges, and the change
    (gained green, lost dashed red, kept grey, width growing with |B - A|); hubs as stars (of
    A, of B, and every hub of either in the change panel)."""
    edges = data["gained"] + data["lost"] + data["changed"]
    if not edges:
        return empty_figure("no edges in either top-k")
    layer_of = {b: i for i, b in enumerate(data["layer_indices"])}
    span = max(abs(e["delta"]) for e in edges) or 1.0
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.05, subplot_titles=(
        f"A: {data['a']} (top-{data['k']})", f"B: {data['b']} (top-{data['k']})", "A → B"))
    in_a = data["lost"] + data["changed"]
    in_b = data["gained"] + data["changed"]
    for col, chosen, who, hubs in ((1, in_a, "A", data["hubs_a"]), (2, in_b, "B", data["hubs_b"])):
        _edge_traces(fig, chosen, layer_of, col, name=f"{who}'s top-k", group=f"top-{who}",
                     color="#4c72b0", dash="solid", width=2.0, legend=False)
        names = sorted({e["source"] for e in chosen} | {e["target"] for e in chosen})
        _node_trace(fig, names, {h["name"]: f"hub of {who}, rank {h['rank']}, degree {h['degree']}"
                                 for h in hubs if h["is_hub"]}, layer_of, col, legend=False)
    for status, (color, dash, label) in STATUS_STYLE.items():
        chosen = [e for e in edges if e["status"] == status]
        width = 1.5 + 3.0 * (sum(abs(e["delta"]) for e in chosen) / len(chosen) / span) if chosen else 1.5
        _edge_traces(fig, chosen, layer_of, 3, name=f"{label}: {len(chosen)}", group=status, color=color,
                     dash=dash, width=width, legend=True)
    moves = {m["name"]: f"{m['status']} (rank A {m['rank_a'] or '–'}, rank B {m['rank_b'] or '–'})"
             for m in data["hub_moves"]}
    names = sorted({e["source"] for e in edges} | {e["target"] for e in edges})
    _node_trace(fig, names, moves, layer_of, 3, legend=True)
    fig.update_xaxes(title="head", dtick=1, zeroline=False)
    fig.update_yaxes(tickvals=[-i for i in range(len(data["layer_indices"]))],
                     ticktext=[f"L{b}" for b in data["layer_indices"]], zeroline=False)
    fig.update_yaxes(title="layer", row=1, col=1)
    fig.update_layout(legend=dict(orientation="h", y=-0.2))
    return base_layout(fig, f"{data['pairing']} top-{data['k']} edges of A and B, and what changed", height=480)


def timeline_figure(data: TimelineOut, step: int | None) -> go.Figure:
    """One PK line per edge over the series' steps (log x), the shown checkpoint marked."""
    if not data["edges"]:
        return empty_figure("no edges to follow")
    steps = data["steps"]
    fig = go.Figure()
    for i, e in enumerate(data["edges"]):
        fig.add_trace(go.Scatter(
            x=steps, y=e["pk"], mode="lines+markers", name=f"{e['source']} → {e['target']}",
            line=dict(color=TRAJECTORY_COLORS[i % len(TRAJECTORY_COLORS)], width=2),
            customdata=data["models"],
            hovertemplate="step %{x}<br>PK %{y:.3f}<br>%{customdata}<extra>%{fullData.name}</extra>"))
    if step is not None:
        fig.add_vline(x=step, line=dict(color="#333", dash="dot", width=1))
    positive = all(s > 0 for s in steps)
    fig.update_xaxes(title="training step", type="log" if positive and len(steps) > 2 else "linear",
                     tickvals=steps, ticktext=[str(s) for s in steps])
    fig.update_yaxes(title=f"{data['pairing']} PK")
    return base_layout(fig, f"{data['pairing']} PK over {data['series']}: {data['selection']}", height=440)


def checkpoint_heatmap(grid: ScoreGrid, step: int, model: str, zmax: float | None = None) -> go.Figure:
    """The shown checkpoint's PK grid (GET /api/pk), source heads x target heads (invalid
    pairs blank; rows and columns with no valid pair left out). ``zmax``: the colour scale's
    top shared by every checkpoint of a series (default: this grid's max)."""
    hi = grid.get("max")
    if zmax is not None:
        hi = zmax if hi is None else max(hi, zmax)
    (z,), rows, cols = cropped([masked_grid(grid["grid"], grid["valid"])], grid["source_labels"],
                               grid["target_labels"])
    fig = go.Figure(go.Heatmap(
        z=z, x=cols, y=rows,
        zmin=grid.get("min"), zmax=hi, colorscale="Viridis", hoverongaps=False,
        colorbar=dict(thickness=10, title=dict(text="PK")),
        hovertemplate="%{y} → %{x}<br>PK %{z:.3f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(tickangle=-90)
    return base_layout(fig, f"{grid['pairing']} PK at step {step} ({model})", height=440)
