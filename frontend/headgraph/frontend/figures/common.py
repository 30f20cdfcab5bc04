"""Shared look of every figure: pairing/class colours, metric titles, font, base layout, formatting.

Pure helpers with no Dash or HTTP, used by every figure module in this package.
"""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Sequence

import plotly.graph_objects as go

PAIRING_COLORS: dict[str, str] = {"OQ": "#d62728", "OK": "#2ca02c", "OV": "#1f77b4"}
OTHER_PAIRING_COLOR = "#7f7f7f"
CLASS_PALETTE: tuple[str, ...] = ("#9467bd", "#ff7f0e", "#17becf", "#e377c2", "#bcbd22",
                                  "#8c564b", "#1f77b4", "#d62728", "#2ca02c", "#7f7f7f")
NO_CLASS_COLOR = "#8c9bb0"
METRIC_TITLES = {"raw": "PK", "normalized": "normalized PK", "z": "z-score (Haar)", "cs": "CS"}
FONT = dict(family="Inter, Segoe UI, Helvetica, Arial, sans-serif", size=12)
_KEPT_TRACES = ("heatmap", "scatter", "scattergl", "bar")
_DROPPED_LAYOUT = ("polar", "ternary", "scene", "geo", "coloraxis")


def slim_template(name: str = "plotly_white") -> go.layout.Template:
    """Plotly's ``name`` template without the parts of chart types headgraph never draws
    (3-D, polar, geo, ...): every figure carries its template, and the full one is ~7 KB of
    each callback answer; this one is ~2.5 KB and looks the same."""
    import plotly.io as pio

    full = pio.templates[name].to_plotly_json()
    return go.layout.Template(
        layout={k: v for k, v in full["layout"].items() if k not in _DROPPED_LAYOUT},
        data={k: v for k, v in full["data"].items() if k in _KEPT_TRACES})


TEMPLATE = slim_template()


def base_layout(fig: go.Figure, title: str, height: int = 520) -> go.Figure:
    """Apply the shared template, font, left-aligned title and margins to ``fig`` (returned)."""
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
    return base_layout(fig, "", height)


def pairing_color(pairing: str, alpha: float = 1.0) -> str:
    """Paper colours (OQ red, OK green, OV blue) as rgba with the given opacity."""
    hex_ = PAIRING_COLORS.get(pairing, OTHER_PAIRING_COLOR).lstrip("#")
    r, g, b = (int(hex_[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha:.3f})"


def class_colors(classes: Sequence[str]) -> dict[str, str]:
    """Stable colour per class name (order of first appearance)."""
    return {c: CLASS_PALETTE[i % len(CLASS_PALETTE)] for i, c in enumerate(dict.fromkeys(classes))}


def fmt_value(v: Any, digits: int = 3) -> str:
    """A number for hover text: ``digits`` significant digits, "–" for None or non-finite."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{v:.{digits}g}" if isinstance(v, float) else str(v)
