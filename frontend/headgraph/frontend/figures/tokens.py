"""Per-head layer x head grids of attention-pattern scores (Fig. 7) and top tokens of a role subspace (Fig. 6).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from headgraph.frontend.api.answers import PatternsOut, TokensOut
from headgraph.frontend.api.names import head_label
from headgraph.frontend.figures.common import base_layout


def patterns_figure(patterns: PatternsOut, classes: dict[str, str] | None = None) -> go.Figure:
    """One layer x head heatmap per attention-pattern score (identity, previous token, ...)."""
    kinds = patterns["kinds"]
    layers = patterns["layer_indices"]
    fig = make_subplots(rows=1, cols=len(kinds), subplot_titles=[k.replace("_", " ") for k in kinds],
                        horizontal_spacing=0.025, shared_yaxes=True)
    for c, kind in enumerate(kinds, start=1):
        z = patterns["scores"][kind]
        n = len(z[0]) if z else 0
        names = [[head_label(layer, h) for h in range(n)] for layer in layers]
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
    return base_layout(fig, "Attention-pattern scores per head (identity and pattern scores, Fig. 7)",
                       height=max(260, 120 + 36 * len(layers)))


def baseline_line(head: dict[str, Any] | None) -> str:
    """Hover line comparing a head's token list with random subspaces of its rank ('' unknown)."""
    if not head or head.get("above_baseline") is None:
        return ""
    mean, thr = head.get("mean_score"), head.get("baseline_threshold")
    nums = f" (mean {mean:.3f} vs random 95% {thr:.3f})" if mean is not None and thr is not None else ""
    if head["above_baseline"]:
        return f"<br>above the random-subspace baseline{nums}"
    return f"<br><b>at random level</b>: no better than a random rank-{head.get('rank', '?')} subspace{nums}"


# Cells past which a grid shows one token per cell: each extra text line is a multi-line SVG
# text Plotly lays out and measures per cell (~0.2 s more on SmolLM2's 270), and the grid
# grows ~40 px a row; the hover and the head panel keep the whole list.
DENSE_TOKEN_CELLS = 144


def token_grid_figure(tokens: TokensOut, layers: Sequence[int], n_heads: int,
                      shown: int | None = None) -> go.Figure:
    """Top tokens of each head's role subspace in a layer x head grid (paper Fig. 6).

    Cell colour = top-1 score; cell text = the ``shown`` best tokens (default: 3, or 1 on a
    grid of more than DENSE_TOKEN_CELLS heads). A list whose scores do not
    exceed those of random subspaces of the same rank (the API's ``above_baseline`` False) is
    greyed and says so on hover: its tokens name nothing the head does.
    """
    rows = {(h["layer"], h["head"]): h for h in tokens["heads"]}
    if shown is None:
        shown = 1 if len(layers) * n_heads > DENSE_TOKEN_CELLS else 3
    z, text, hover = [], [], []
    for layer in layers:
        zr, tr, hr = [], [], []
        for head in range(n_heads):
            h = rows.get((layer, head))
            toks = h["tokens"] if h else []
            zr.append(toks[0]["score"] if toks else None)
            shown_text = "<br>".join(t.get("display", t.get("text", "")) for t in toks[:shown])
            at_random = bool(h) and h.get("above_baseline") is False
            tr.append(f"<span style='color:#8a8a8a'><i>{shown_text}</i></span>" if at_random and shown_text
                      else shown_text)
            hr.append(f"{h['name'] if h else ''}{baseline_line(h)}<br>" + "<br>".join(
                f"{t.get('display', t.get('text', ''))}  {t['score']:.3f}"
                + (" (≤ random)" if t.get("above_baseline") is False else "") for t in toks))
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
    return base_layout(fig, f"Top tokens of each head's {tokens['role']} subspace (fraction of the centred "
                            "unembedding vector inside the subspace)",
                       height=max(300, 150 + (16 + 18 * shown) * len(layers)))
