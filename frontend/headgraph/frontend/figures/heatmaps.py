"""Score heatmaps: the full source x target head grid of a pairing and one head's layer x head slice.

Input is a /api/pk or /api/cs answer: grid/valid nested [L][Hs][L][Ht] with flattened labels.
On a grouped-query model a K / V axis of a PK grid holds KV groups ("L6KV1"), while CS grids
have query heads on both axes: hovers and head grids translate between the two (a query head
reads its group; a group's CS is the mean over its query heads).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from headgraph.frontend.api.answers import ScoreGrid
from headgraph.frontend.api.names import head_label
from headgraph.frontend.figures.common import METRIC_TITLES, base_layout
from headgraph.frontend.figures.palette import NO_CLASS, class_palette

_NAME_RE = re.compile(r"^L(\d+)(H|KV)(\d+)$")


class BlockGrid(ScoreGrid):
    """One (source layer, target layer) block of a grid (:func:`block_grid`), ``zoom`` naming it."""

    zoom: list[str]


def flatten_grid(grid: list) -> list[list[float | None]]:
    """[L][Hs][L][Ht] nested lists -> [(L*Hs)][(L*Ht)] rows (source-major, as the labels)."""
    return [[v for tl in sh for v in tl] for sl in grid for sh in sl]


def grid_labels(grid: ScoreGrid) -> ScoreGrid:
    """``grid`` with axis labels that match its shape.

    A CS grid always has query heads on both axes; a server that names a CS K / V axis by the
    KV groups (fewer labels than columns) gets query-head labels ``L{block}H{h}`` instead.
    """
    g, layers = grid.get("grid") or [], list(grid.get("layer_indices") or [])
    if not g or not layers:
        return grid
    n_src, n_tgt = len(g[0]), len(g[0][0][0]) if g[0] and g[0][0] else 0
    fixed = grid.copy()
    for key, n in (("source_labels", n_src), ("target_labels", n_tgt)):
        if len(grid.get(key) or []) != len(layers) * n:
            fixed[key] = [head_label(layer, h) for layer in layers for h in range(n)]
    return fixed


def _parse(name: str) -> tuple[int, bool, int] | None:
    m = _NAME_RE.match(name)
    return (int(m.group(1)), m.group(2) == "KV", int(m.group(3))) if m else None


def align_axis(main: Sequence[str], other: Sequence[str], *, group: int | None = None) -> list[list[int]]:
    """For each head name on ``main``, the positions on ``other`` holding its score.

    The same name: itself. A query head on a KV axis: its group (query h reads group
    h // group size). A KV group on a query-head axis: all the query heads it serves. [] when
    ``other`` has no such head. ``group`` (query heads per KV group) defaults to the ratio of
    the two axes' heads per layer (both full axes).
    """
    index = {name: i for i, name in enumerate(other)}
    def per_layer(names: Sequence[str]) -> dict[int, int]:
        counts: dict[int, int] = {}
        for name in names:
            p = _parse(name)
            if p:
                counts[p[0]] = counts.get(p[0], 0) + 1
        return counts
    n_main, n_other = per_layer(main), per_layer(other)
    out: list[list[int]] = []
    for name in main:
        if name in index:
            out.append([index[name]])
            continue
        p = _parse(name)
        if p is None or not n_other.get(p[0]) or not n_main.get(p[0]):
            out.append([])
            continue
        layer, kv, idx = p
        if not kv:  # query head -> its KV group
            size = group or max(1, n_main[layer] // n_other[layer])
            hit = index.get(head_label(layer, idx // size, kv=True))
            out.append([] if hit is None else [hit])
        else:  # KV group -> its query heads
            size = group or max(1, n_other[layer] // n_main[layer])
            out.append([index[h] for h in (head_label(layer, idx * size + j) for j in range(size)) if h in index])
    return out


def dense(grid: ScoreGrid) -> np.ndarray:
    """A /api/pk or /api/cs answer as a [(L*Hs), (L*Ht)] float64 array, NaN where not valid."""
    g = np.array(grid["grid"], dtype=float)
    ok = np.array(grid["valid"], dtype=bool)
    rows = g.shape[0] * g.shape[1] if g.ndim == 4 else 0
    g, ok = g.reshape(rows, -1), ok.reshape(rows, -1)
    return np.where(ok & np.isfinite(g), g, np.nan)


def _indicator(mapping: list[list[int]], n_other: int) -> np.ndarray:
    out = np.zeros((len(mapping), n_other))
    for i, hits in enumerate(mapping):
        out[i, hits] = 1.0
    return out


def hover_values(main: ScoreGrid, other: ScoreGrid) -> tuple[np.ndarray, bool]:
    """``other``'s valid scores at ``main``'s cells ([rows, cols], NaN where none), and whether
    any cell is a mean over several query heads (a KV group of a grouped-query model reads
    the mean of its query heads' scores, as the pair panel and the scatter do)."""
    other = grid_labels(other)
    vals = dense(other)
    ok = np.isfinite(vals)
    rows = _indicator(align_axis(main["source_labels"], other["source_labels"]), vals.shape[0])
    cols = _indicator(align_axis(main["target_labels"], other["target_labels"]), vals.shape[1])
    total = rows @ np.where(ok, vals, 0.0) @ cols.T
    count = rows @ ok.astype(float) @ cols.T
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / count, np.nan)
    return mean, bool((count > 1).any())


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


DENSE_CELLS = 64  # more cells than this on an axis: no white gaps (they wash the colour out)


def cell_gap(cells: int) -> float:
    """Pixels between heatmap cells: a hairline for small grids, none for dense ones."""
    return 0.5 if cells <= DENSE_CELLS else 0.0


def grid_height(rows: int) -> int:
    """Figure height for a grid of ``rows`` source heads: 560 px, growing ~3 px a row past
    that (a 270-head model gets ~970 px instead of 1.5 px rows), at most 2000 px."""
    return int(max(560, min(2000, 160 + 3 * rows)))


def class_strips(fig: go.Figure, src: Sequence[str], tgt: Sequence[str], classes: dict[str, str],
                 order: Sequence[str] = ()) -> None:
    """The head-class overlay as two thin strips beside the grid: one cell per source head
    (left) and per target head (top), coloured by class (figures.palette, ``order``: the label
    set's class order), hovering the class name, with a legend of the classes shown (a square
    each, under the figure). Per head, not per cell: a 270 x 90 grid carries 360 class names,
    not 24,300."""
    present = set(classes.get(h, NO_CLASS) for h in [*src, *tgt])
    colors = class_palette(order, present)
    rank = {c: i for i, c in enumerate(colors)}
    names = sorted(present, key=lambda c: (c == NO_CLASS, rank.get(c, len(rank)), c))
    n = len(names)
    scale = [[edge, colors[name]] for k, name in enumerate(names)
             for edge in (k / n, (k + 1) / n)]
    code = {name: k for k, name in enumerate(names)}
    common = dict(colorscale=scale, zmin=-0.5, zmax=n - 0.5, showscale=False, hoverongaps=False)
    fig.add_trace(go.Heatmap(
        z=np.array([[code[classes.get(h, "no class")]] for h in src], dtype=np.int16), y=list(src), x=["class"],
        text=[[classes.get(h, "no class")] for h in src], xaxis="x2", yaxis="y",
        hovertemplate="%{y}: %{text}<extra>class</extra>", name="source class", **common))
    fig.add_trace(go.Heatmap(
        z=np.array([[code[classes.get(h, "no class")] for h in tgt]], dtype=np.int16), x=list(tgt), y=["class"],
        text=[[classes.get(h, "no class") for h in tgt]], xaxis="x", yaxis="y2",
        hovertemplate="%{x}: %{text}<extra>class</extra>", name="target class", **common))
    counts = {c: sum(classes.get(h, NO_CLASS) == c for h in dict.fromkeys([*src, *tgt])) for c in names}
    for c in names:  # the strips' legend (a heatmap has none): one square per class shown
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", hoverinfo="skip", name=f"{c} ({counts[c]})",
                                 marker=dict(symbol="square", size=11, color=colors[c]), showlegend=True,
                                 legendgroup="class:" + c, meta="class-legend"))
    fig.update_layout(legend=dict(orientation="h", yref="container", y=0.0, yanchor="bottom", x=0.0,
                                  title=dict(text="class")))
    # The source axis is anchored on the strip, so its labels and title sit left of it, in
    # the margin, not in the narrow gap between the strip and the grid (where they overlapped).
    fig.update_layout(xaxis=dict(domain=[0.035, 1.0]), yaxis=dict(domain=[0.0, 0.965], anchor="x2"),
                      xaxis2=dict(domain=[0.0, 0.025], anchor="y", showticklabels=False, showgrid=False,
                                  zeroline=False, fixedrange=True),
                      yaxis2=dict(domain=[0.975, 1.0], anchor="x", showticklabels=False, showgrid=False,
                                  zeroline=False, fixedrange=True))


def score_heatmap(grid: ScoreGrid, *, metric: str, hover_grids: dict[str, ScoreGrid] | None = None,
                  classes: dict[str, str] | None = None, class_order: Sequence[str] = ()) -> go.Figure:
    """Full source-head x target-head grid of one pairing, blocked by layer with layer ticks.

    ``grid`` is a /api/pk or /api/cs answer; ``hover_grids`` adds other metrics to the hover
    (e.g. {"CS": cs_json, "PK": pk_json}); invalid cells are blank. The cells travel as
    binary float32 arrays (z, and the other metrics as numeric customdata [rows, cols, k]),
    not per-cell strings: exact values are in the pair panel and the downloads. ``classes``
    (head -> class) draws the class strips (:func:`class_strips`) in ``class_order``'s colours.
    """
    grid = grid_labels(grid)
    src, tgt = grid["source_labels"], grid["target_labels"]
    z = dense(grid)
    label = METRIC_TITLES.get(metric, metric)
    extra_hover, custom = "", None
    if hover_grids:
        layers = [hover_values(grid, g) for g in hover_grids.values()]
        custom = np.stack([v for v, _ in layers], axis=-1).astype(np.float32)
        extra_hover = "".join(
            f"<br>{name}{' (KV group: mean over its query heads)' if averaged else ''}: "
            f"%{{customdata[{k}]:.4g}}"
            for k, (name, (_, averaged)) in enumerate(zip(hover_grids, layers)))
    fig = go.Figure(go.Heatmap(
        z=z.astype(np.float32), x=list(tgt), y=list(src), customdata=custom,
        colorscale="Viridis", colorbar=dict(title=dict(text=label, side="right"), thickness=14),
        hoverongaps=False, xgap=cell_gap(len(tgt)), ygap=cell_gap(len(src)),
        hovertemplate=f"source %{{y}}<br>target %{{x}}<br>{label}: %{{z:.4g}}{extra_hover}<extra></extra>"))
    shapes: list[dict[str, Any]] = []  # layer separators, set at once (add_shape revalidates all: O(n^2))
    line = dict(type="line", line=dict(color="white", width=2), layer="above")
    for axis, labels in (("x", tgt), ("y", src)):
        blocks = _layer_blocks(labels)
        ticks: dict[str, Any] = dict(type="category", tickmode="array",
                                     tickvals=[(a + b) / 2 for _, a, b in blocks],
                                     ticktext=[name for name, _, _ in blocks], showgrid=False, zeroline=False)
        if axis == "x":
            fig.update_xaxes(title=f"target head ({grid['target_role']})", **ticks)
            shapes += [dict(x0=a - 0.5, x1=a - 0.5, y0=-0.5, y1=len(src) - 0.5, **line) for _, a, _ in blocks[1:]]
        else:
            fig.update_yaxes(title=f"source head ({grid['source_role']})", autorange="reversed", **ticks)
            shapes += [dict(y0=a - 0.5, y1=a - 0.5, x0=-0.5, x1=len(tgt) - 0.5, **line) for _, a, _ in blocks[1:]]
    fig.update_layout(shapes=shapes)
    if classes:
        class_strips(fig, src, tgt, classes, class_order)
    fig.update_layout(plot_bgcolor="#f1f3f6")
    title = f"{grid['pairing']}: {label} of every (source, target) head pair ({grid['model']}, {grid['order']})"
    if grid.get("kind") == "cs":
        title = f"CS mode {grid['target_role']}: Composition Score ({grid['model']}, {grid['order']})"
    return base_layout(fig, title, height=grid_height(len(src)))


def layer_blocks(grid: ScoreGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (source layer, target layer) block of a grid: the mean and the max of its valid
    cells and their count, each [L, L] (NaN where a block has none, e.g. backward layers)."""
    grid = grid_labels(grid)
    n_layers = len(grid["layer_indices"])
    flat = dense(grid)
    cells = flat.reshape(n_layers, flat.shape[0] // n_layers, n_layers, flat.shape[1] // n_layers)
    ok = np.isfinite(cells)
    count = ok.sum(axis=(1, 3))
    total = np.where(ok, cells, 0.0).sum(axis=(1, 3))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / count, np.nan)
    peak = np.where(count > 0, np.where(ok, cells, -np.inf).max(axis=(1, 3)), np.nan)
    return mean, peak, count


def layer_overview(grid: ScoreGrid, *, metric: str) -> go.Figure:
    """Layer-aggregated heatmap: one cell per (source layer, target layer) block, its mean
    score (hover: max and valid pairs). A click drills down to the block's heads: on a
    1024-head model the whole grid is 10^6 cells, the overview L^2."""
    grid = grid_labels(grid)
    mean, peak, count = layer_blocks(grid)
    layers = [f"L{layer}" for layer in grid["layer_indices"]]
    label = METRIC_TITLES.get(metric, metric)
    fig = go.Figure(go.Heatmap(
        z=mean.astype(np.float32), x=layers, y=layers,
        customdata=np.stack([peak, count.astype(float)], axis=-1).astype(np.float32),
        colorscale="Viridis", colorbar=dict(title=dict(text=f"mean {label}", side="right"), thickness=14),
        hoverongaps=False, xgap=cell_gap(len(layers)), ygap=cell_gap(len(layers)),
        hovertemplate=(f"source layer %{{y}} → target layer %{{x}}<br>mean {label}: %{{z:.4g}}"
                       f"<br>max: %{{customdata[0]:.4g}}<br>valid pairs: %{{customdata[1]}}"
                       "<br>click: this block's heads<extra></extra>")))
    fig.update_xaxes(title=f"target layer ({grid['target_role']})", type="category", showgrid=False,
                     zeroline=False)
    fig.update_yaxes(title=f"source layer ({grid['source_role']})", type="category", autorange="reversed",
                     showgrid=False, zeroline=False)
    fig.update_layout(plot_bgcolor="#f1f3f6")
    return base_layout(fig, f"{grid['pairing']}: mean {label} per layer block ({grid['model']}, "
                            f"{grid['order']}) · click a block for its heads",
                       height=int(max(520, min(1000, 160 + 16 * len(layers)))))


def block_grid(grid: ScoreGrid, zoom: tuple[str, str]) -> BlockGrid:
    """The (source layer, target layer) block of a /api/pk or /api/cs answer, in the same
    shape ([1][Hs][1][Ht] with the block's labels). KeyError for a layer the grid lacks."""
    grid = grid_labels(grid)
    layers = list(grid["layer_indices"])
    try:
        i, j = (layers.index(int(name[1:])) for name in zoom)
    except ValueError as err:
        raise KeyError(f"{zoom[0]} → {zoom[1]} is not a layer block of this model "
                       f"(layers {layers[0]}..{layers[-1]})") from err
    n_src, n_tgt = len(grid["source_labels"]) // len(layers), len(grid["target_labels"]) // len(layers)
    return {**grid, "grid": [[[sh[j]] for sh in grid["grid"][i]]],
            "valid": [[[sh[j]] for sh in grid["valid"][i]]],
            "layer_indices": [layers[i]],
            "source_labels": grid["source_labels"][i * n_src:(i + 1) * n_src],
            "target_labels": grid["target_labels"][j * n_tgt:(j + 1) * n_tgt],
            "zoom": list(zoom)}


def axis_head(grid: ScoreGrid, head: str, direction: str) -> str:
    """The name ``head`` has on the grid's source (out) or target (in) axis: itself, or on a
    KV axis of a grouped-query model the KV group a query head reads (L6H4 -> L6KV1).

    KeyError when the axis has no such head (a KV group on a query-head axis).
    """
    grid = grid_labels(grid)
    src, tgt = grid["source_labels"], grid["target_labels"]
    labels = src if direction == "out" else tgt
    wide, narrow = max(len(src), len(tgt)), min(len(src), len(tgt))
    hit = align_axis([head], labels, group=max(1, wide // max(1, narrow)))[0]
    if len(hit) != 1:
        where = "source (out)" if direction == "out" else "target (in)"
        hint = "; pick direction 'in'" if direction == "out" else "; pick direction 'out'"
        raise KeyError(f"{head} is not on the {where} axis of {grid.get('pairing', 'this grid')}"
                       + (hint if hit else ""))
    return labels[hit[0]]


def head_slice(grid: ScoreGrid, head: str, direction: str) -> tuple[list[list[float | None]], list[int], int]:
    """A head's outgoing (as source) or incoming (as target) scores as [layer][head] rows.

    Returns (rows, layer block numbers, heads per row); invalid cells are None. A query head
    on a KV axis reads its KV group's row (:func:`axis_head`).
    """
    grid = grid_labels(grid)
    labels = grid["source_labels"] if direction == "out" else grid["target_labels"]
    layers = grid["layer_indices"]
    idx = labels.index(axis_head(grid, head, direction))
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


def head_grid_figure(grid: ScoreGrid, head: str, direction: str, *, metric: str) -> go.Figure:
    """Layer x head grid of one head's outgoing or incoming scores (deeper layers higher)."""
    grid = grid_labels(grid)
    rows, layers, n = head_slice(grid, head, direction)
    shown = axis_head(grid, head, direction)
    label = METRIC_TITLES.get(metric, metric)
    other = "target" if direction == "out" else "source"
    names = grid["target_labels"] if direction == "out" else grid["source_labels"]
    prefix = f"L{layers[0]}" if layers else ""
    columns = [name[len(prefix):] if name.startswith(prefix) else f"H{h}" for h, name in enumerate(names[:n])]
    # Categorical axes: a click reports x="H3" (or "KV1" on a grouped K/V axis), y="L1",
    # i.e. the head name "L1H3" / "L1KV1".
    fig = go.Figure(go.Heatmap(
        z=rows, x=columns, y=[f"L{layer}" for layer in layers],
        colorscale="Viridis", hoverongaps=False, xgap=1, ygap=1,
        colorbar=dict(title=dict(text=label, side="right"), thickness=14),
        hovertemplate=f"{other} %{{y}}%{{x}}<br>{label}: %{{z:.4g}}<extra></extra>"))
    fig.update_xaxes(title=f"{other} head", type="category", showgrid=False, zeroline=False)
    fig.update_yaxes(title=f"{other} layer", type="category", showgrid=False, zeroline=False)
    fig.update_layout(plot_bgcolor="#f1f3f6")
    arrow = "→ later heads" if direction == "out" else "← earlier heads"
    who = head if shown == head else f"{shown} (the KV group {head} reads)"
    return base_layout(fig, f"{who} {arrow} ({grid['pairing']}, {label})", height=320)
