"""Reference views: KL(random || model) role grid, model PK vs Haar density, and the null comparison.

Inputs are the /api/kl answer and the anisotropy-aware null summaries (paper Fig. 8).
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from headgraph.frontend.figures.common import base_layout, empty_figure, fmt_value, pairing_color


def kl_grid_figure(kl: dict[str, Any], selected: str | None = None) -> go.Figure:
    """4 x 4 KL(random || model) grid over (source role, target role), numbers in the cells."""
    roles = kl["roles"]
    z = kl["kl"]
    text = [[fmt_value(v, 3) for v in row] for row in z]
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
    return base_layout(fig, "KL(random ‖ model) per role pairing", height=430)


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
    fig.update_layout(legend=dict(x=0.99, xanchor="right", y=0.9), bargap=0)
    return base_layout(fig, f"{pairing}: model PK vs random subspaces (d_model {kl['d_model']}, rank {kl['rank']})",
                       height=430)


def null_summary(nulls: dict[str, Any], pairing: str) -> dict[str, Any] | None:
    """The anisotropic null summary (mean, std, quantiles) of one pairing, if the API has it."""
    entry = nulls.get(pairing) if isinstance(nulls, dict) else None
    if not isinstance(entry, dict):
        return None
    summary = entry.get("summary", entry)
    return summary if summary.get("mean") is not None else None


def null_figure(nulls: dict[str, Any], haar: dict[str, Any] | None = None) -> go.Figure:
    """Per pairing: Haar mean ± std next to the anisotropy-aware null mean ± std (and its 95%),
    and the same architecture at random initialization (``summary_random_init``) when given."""
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
    init = {p: nulls[p].get("summary_random_init") for p in names if isinstance(nulls.get(p), dict)}
    init = {p: v for p, v in init.items() if isinstance(v, dict) and v.get("mean") is not None}
    if init:  # the same architecture at random initialization: what training changed
        fig.add_trace(go.Scatter(x=[x + 0.36 for x, p in zip(xs, names) if p in init],
                                 y=[init[p]["mean"] for p in names if p in init], mode="markers",
                                 name="random-init model mean ± std",
                                 error_y=dict(type="data", array=[init[p].get("std") or 0 for p in names if p in init],
                                              color="#2ca02c", thickness=1.5, width=6),
                                 marker=dict(color="#2ca02c", size=10, symbol="square")))
    q95 = [(summaries[p].get("quantiles") or {}).get("0.95") for p in names]
    if any(v is not None for v in q95):
        fig.add_trace(go.Scatter(x=[x + 0.12 for x in xs], y=q95, mode="markers", name="anisotropic null 95%",
                                 marker=dict(symbol="line-ew", size=18, line=dict(color="#9467bd", width=2.5))))
    fig.update_xaxes(tickmode="array", tickvals=xs, ticktext=names, range=[-0.6, len(names) - 0.2])
    fig.update_yaxes(title="PK under the null")
    fig.update_layout(legend=dict(orientation="h", y=-0.18))
    return base_layout(fig, "Nulls per pairing: random planes in isotropic R^d vs planes drawn where this "
                            "model's weights live (anisotropic)", height=340)
