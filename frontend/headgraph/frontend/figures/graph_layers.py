"""The head graph of too many edges, aggregated by layer: edges per (source layer, target layer).

A threshold or FDR graph can pass thousands of edges (the API keeps up to max_edges per
pairing); drawn head by head that is a hairball nobody can read. Above EDGE_DRAW_LIMIT edges
the graph view draws this instead: one cell per layer pair with its edge count (per pairing
in the hover), and a click on a cell sets the graph's layer range to the blocks from its
source to its target layer, where the heads are drawn again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from headgraph.frontend.figures.common import base_layout
from headgraph.frontend.figures.graph_filters import layer_of

EDGE_DRAW_LIMIT = 600  # the most edges the graph view draws head by head


def _layer(name: str) -> int:
    layer = layer_of(name)
    return -1 if layer is None else layer


def layer_counts(edges: Sequence[dict[str, Any]], layers: Sequence[int]
                 ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Edges per (source layer, target layer): the total [L, L] (rows: source, in ``layers``'
    order) and the same per pairing. Edges whose ends are not in ``layers`` are left out."""
    row = {layer: i for i, layer in enumerate(layers)}
    total = np.zeros((len(layers), len(layers)), dtype=np.int64)
    per: dict[str, np.ndarray] = {}
    for e in edges:
        s, t = (row.get(_layer(e["source"])), row.get(_layer(e["target"])))
        if s is None or t is None:
            continue
        p = str(e.get("pairing", e.get("key", "")))
        per.setdefault(p, np.zeros_like(total))[s, t] += 1
        total[s, t] += 1
    return total, per


def too_many_note(n_edges: int, limit: int = EDGE_DRAW_LIMIT) -> str:
    """What the view says instead of drawing a hairball (with where to go next)."""
    return (f"{n_edges} edges: more than {limit} are not drawn head by head. Edges per layer pair "
            "below; click a cell, or set 'layers' (e.g. 10-20), to see those heads; or raise the "
            "threshold (lower q)")


def layer_graph_figure(edges: Sequence[dict[str, Any]], layers: Sequence[int], *,
                       limit: int = EDGE_DRAW_LIMIT, rule: str = "") -> go.Figure:
    """The layer x layer edge-count heatmap of a graph too big to draw (module docstring).

    Cells carry customdata ["layers", lo, hi] (a click sets that layer range) and the counts
    per pairing for the hover; empty layer pairs are blank."""
    total, per = layer_counts(edges, layers)
    names = [f"L{layer}" for layer in layers]
    pairings = sorted(per)
    custom = [[["layers", min(layers[i], layers[j]), max(layers[i], layers[j]),
                " · ".join(f"{p} {int(per[p][i, j])}" for p in pairings)]
               for j in range(len(layers))] for i in range(len(layers))]
    z = np.where(total > 0, total, np.nan)
    fig = go.Figure(go.Heatmap(
        z=z, x=names, y=names, customdata=custom, colorscale="Blues", hoverongaps=False,
        colorbar=dict(title=dict(text="edges", side="right"), thickness=14),
        xgap=1 if len(layers) <= 64 else 0, ygap=1 if len(layers) <= 64 else 0,
        hovertemplate=("source layer %{y} → target layer %{x}<br>%{z} edges (%{customdata[3]})"
                       "<br>click: draw the heads of layers %{customdata[1]}–%{customdata[2]}<extra></extra>")))
    fig.update_xaxes(title="target layer", type="category", showgrid=False, zeroline=False)
    fig.update_yaxes(title="source layer", type="category", autorange="reversed", showgrid=False,
                     zeroline=False)
    fig.update_layout(plot_bgcolor="#f1f3f6", meta={"aggregated": True, "edges": int(total.sum()),
                                                    "limit": int(limit)})
    title = (f"Head graph{' · ' + rule if rule else ''} · {int(total.sum())} edges > {limit}: "
             "edges per layer pair (click a cell for its heads)")
    return base_layout(fig, title, height=int(max(520, min(1000, 160 + 16 * len(layers)))))
