"""PK vs Composition Score scatter (paper Fig. 5) with quadrant colours and top-x% cutoffs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

from headgraph.frontend.api.answers import ScatterOut
from headgraph.frontend.figures.common import base_layout, fmt_value

QUADRANTS: dict[int, tuple[str, str]] = {3: ("both", "#9467bd"), 1: ("PK only", "#d62728"),
                                         2: ("CS only", "#1f77b4"), 0: ("others", "#c7c7c7")}


def top_cutoffs(points: dict[str, Any]) -> tuple[float | None, float | None]:
    """Where the top-x% sets start: the lowest PK among the API's PK-top quadrants (1, 3) and
    the lowest CS among its CS-top quadrants (2, 3)."""
    quad = points.get("quadrant") or []
    pk_top = [v for v, q in zip(points["pk"], quad) if q in (1, 3)]
    cs_top = [v for v, q in zip(points["cs"], quad) if q in (2, 3)]
    return (min(pk_top) if pk_top else None, min(cs_top) if cs_top else None)


DENSE_POINTS = 5000   # above this many pairs the "others" quadrant is drawn as a density
DENSITY_BINS = 120


def density_trace(cs: np.ndarray, pk: np.ndarray, name: str) -> go.Heatmap:
    """The pairs (cs, pk) as counts on a DENSITY_BINS^2 grid over their range, grey on a log
    scale, empty cells transparent: one trace whatever the number of pairs."""
    counts, xe, ye = np.histogram2d(cs, pk, bins=DENSITY_BINS)
    z = np.where(counts > 0, counts, np.nan).T.astype(np.float32)  # [pk bin, cs bin]
    return go.Heatmap(
        x=((xe[:-1] + xe[1:]) / 2).astype(np.float32), y=((ye[:-1] + ye[1:]) / 2).astype(np.float32),
        z=np.log10(z), customdata=z, name=name, showlegend=True, showscale=False, hoverongaps=False,
        colorscale=[[0, "#e4e4e4"], [1, "#5f5f5f"]],
        hovertemplate="%{customdata:.0f} pairs here (CS ≈ %{x:.3g}, PK ≈ %{y:.3g})<extra>" + name + "</extra>")


def scatter_figure(data: ScatterOut) -> go.Figure:
    """PK vs CS per pair (paper Fig. 5): quadrant colours, top-x% cutoff lines, Spearman rho.

    Every pair of the top sets (both, PK only, CS only) is a point (hover: its heads; click:
    its pair panel). Above DENSE_POINTS pairs the rest ("others", most of them: 21k of 23k on
    SmolLM2) is a density of counts instead of points, so the figure's size and draw time
    follow the top sets, not the model's head count squared (and no WebGL is needed for it).
    """
    pts = data["points"]
    cmp_ = data.get("comparison", {})
    pk = np.asarray(pts["pk"], dtype=np.float32)  # float32 travels binary on the wire
    cs = np.asarray(pts["cs"], dtype=np.float32)
    quad = np.asarray(pts.get("quadrant") or [0] * len(pk), dtype=np.int8)
    # The pair names as one numpy string array: plotly checks it as a whole instead of string
    # by string (23k points: 360 ms less), and it still reaches a click as [source, target].
    names = np.array([pts["source"], pts["target"]], dtype=str).T.reshape(len(pk), 2)
    dense = len(pk) > DENSE_POINTS
    n_points = int(np.count_nonzero(quad)) if dense else len(pk)
    fig = go.Figure()
    for code in (0, 2, 1, 3):
        name, color = QUADRANTS[code]
        idx = np.nonzero(quad == code)[0]
        if dense and code == 0:
            if len(idx):
                fig.add_trace(density_trace(cs[idx], pk[idx], f"{name} ({len(idx)}, density)"))
            continue
        trace = go.Scattergl if n_points > DENSE_POINTS else go.Scatter
        fig.add_trace(trace(
            x=cs[idx], y=pk[idx], mode="markers", name=f"{name} ({len(idx)})",
            customdata=names[idx],
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
    title = (f"{data['pairing']}: PK vs CS · Spearman ρ all = {fmt_value(rho_all)}, "
             f"top set = {fmt_value(rho_top)}")
    fig.update_layout(legend=dict(title="quadrant"), clickmode="event")
    return base_layout(fig, title, height=560)
