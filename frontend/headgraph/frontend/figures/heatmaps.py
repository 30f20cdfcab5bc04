"""Score heatmaps: the full source x target head grid of a pairing and one head's layer x head slice.

Input is a /api/pk or /api/cs answer: grid/valid nested [L][Hs][L][Ht] with flattened labels.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import plotly.graph_objects as go

from headgraph.frontend.figures.common import METRIC_TITLES, base_layout, fmt_value


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
               + [fmt_value(extra[n][i][j], 4) for n in extra] for j, t in enumerate(tgt)]
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
    return base_layout(fig, title, height=560)


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
    return base_layout(fig, f"{head} {arrow} ({grid['pairing']}, {label})", height=320)
