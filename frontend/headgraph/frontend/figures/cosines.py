"""Principal-angle cosines of one head pair as a bar chart (PK is the sum of their squares).
"""

from __future__ import annotations

import plotly.graph_objects as go

from headgraph.frontend.api.answers import PairOut
from headgraph.frontend.figures.common import base_layout, pairing_color


def cosines_figure(pair: PairOut) -> go.Figure:
    """Principal-angle cosines of one head pair, descending (PK = sum of their squares)."""
    cos = pair["cosines"]
    fig = go.Figure(go.Bar(x=list(range(1, len(cos) + 1)), y=cos,
                           marker=dict(color=pairing_color(pair["pairing"], 0.8)),
                           hovertemplate="cos θ%{x} = %{y:.4f}<extra></extra>"))
    fig.update_xaxes(title="principal angle", dtick=max(1, len(cos) // 8))
    fig.update_yaxes(title="cosine", range=[0, 1])
    return base_layout(fig, f"principal cosines · PK = Σcos² = {pair['pk']:.4g}", height=260,
                       margin=dict(l=50, r=20, t=40, b=40))
