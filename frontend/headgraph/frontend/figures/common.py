"""Shared look of every figure: pairing/class colours, metric titles, font, base layout, formatting.

Pure helpers with no Dash or HTTP, used by every figure module in this package.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from headgraph.frontend.figures.palette import CLASS_PALETTE, NO_CLASS_COLOR, class_palette

__all__ = ["CLASS_PALETTE", "FONT", "METRIC_TITLES", "NO_CLASS_COLOR", "OTHER_PAIRING_COLOR", "PAIRING_COLORS",
           "TEMPLATE", "base_layout", "class_colors", "empty_figure", "fitted_margins", "fmt_value",
           "pairing_color", "slim_template"]
PAIRING_COLORS: dict[str, str] = {"OQ": "#d62728", "OK": "#2ca02c", "OV": "#1f77b4"}
OTHER_PAIRING_COLOR = "#7f7f7f"
METRIC_TITLES = {"raw": "PK", "normalized": "normalized PK", "z": "z-score (Haar)", "cs": "CS",
                 "cka": "linear CKA", "procrustes": "Procrustes similarity"}
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


def base_layout(fig: go.Figure, title: str, height: int = 520, margin: dict[str, int] | None = None) -> go.Figure:
    """Apply the shared template, font, left-aligned title and margins to ``fig`` (returned).

    Call it after the axes' ticks and titles are set: the margins are sized to hold them
    (:func:`fitted_margins`, at least ``margin``), and the legend too if it is set already."""
    fig.update_layout(template=TEMPLATE, font=FONT, height=height,
                      title=dict(text=title, x=0.01, xanchor="left", font=dict(size=15)),
                      margin=fitted_margins(fig, margin or dict(l=60, r=20, t=60, b=50)))
    return fig


CHAR_PX = 7.5     # an upper bound of the mean glyph width of FONT at 12 px
TITLE_PX = 28     # an axis title: its line plus the template's standoff
_PLAIN = re.compile(r"<[^>]+>")


def _label_chars(axis: Any, values: Sequence[Any]) -> int:
    """Characters of an axis' longest tick label: its ticktext, else its string values."""
    labels = axis.ticktext if axis.ticktext is not None else [v for v in values[:4000] if isinstance(v, str)]
    return max((len(_PLAIN.sub("", str(t))) for t in labels), default=4) if labels else 4


def fitted_margins(fig: go.Figure, base: dict[str, int]) -> dict[str, int]:
    """Margins (at least ``base``) that already hold every left/bottom tick label, axis title,
    colour bar and right-hand legend of ``fig``, from the label strings (CHAR_PX a char).

    The template keeps ``automargin`` (a label never clips), but Plotly then measures the
    labels and, when they overflow the margins, draws the whole figure a second time: on a
    270-row grid that second pass was ~40% of the draw. Margins generous enough up front
    make it a no-op."""
    layout: Any = fig.layout  # plotly's layout objects carry no usable types
    traces = list(fig.data)
    out = dict(base)
    for name in [k for k in layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))] or ["xaxis", "yaxis"]:
        axis: Any = layout[name]
        if axis.visible is False:
            continue
        letter = name[0]
        ref = letter + name[5:]
        values: list[Any] = []
        for t in traces:
            seq = getattr(t, letter, None)
            if (getattr(t, letter + "axis", None) or letter) == ref and seq is not None:
                values.extend(seq[:4000])
        chars = _label_chars(axis, values) if axis.showticklabels is not False else 0
        titled = bool(axis.title.text)
        if letter == "y" and axis.side != "right":
            out["l"] = max(out["l"], int(chars * CHAR_PX + 12 + TITLE_PX * titled))
        elif letter == "x" and axis.side != "top":
            n = len(axis.ticktext) if axis.ticktext is not None else len(set(map(str, values))) or 8
            rotated = n * (chars + 1) * CHAR_PX > 900  # Plotly turns crowded labels by 90 degrees
            out["b"] = max(out["b"], int((chars * CHAR_PX if rotated else 18) + 8 + TITLE_PX * titled))
    if any(getattr(t, "showscale", None) is not False and t.type == "heatmap" for t in traces) \
            or layout.coloraxis.colorbar.title.text:
        out["r"] = max(out["r"], 120)
    legend = [str(t.name) for t in traces if t.name and t.showlegend is not False]
    if len(legend) > 1 and layout.showlegend is not False:
        if layout.legend.orientation == "h":
            rows = 1 + int(sum(len(n) * CHAR_PX + 40 for n in legend) // 900)
            out["b"] = max(out["b"], out["b"] + 24 * rows)
        elif layout.legend.x is None or layout.legend.x >= 1:
            widest = max([len(n) for n in legend] + [len(str(layout.legend.title.text or ""))])
            out["r"] = max(out["r"], int(60 + CHAR_PX * widest))
    return out


MESSAGE_WIDTH = 110  # characters per line of an empty figure's message


def empty_figure(message: str, height: int = 420) -> go.Figure:
    """A blank figure carrying a centred message (no data yet, or an API error), wrapped to
    lines of at most MESSAGE_WIDTH characters so a long reason stays inside the figure."""
    fig = go.Figure()
    text = "<br>".join(textwrap.wrap(message, MESSAGE_WIDTH)) or message
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
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
    """Colour per class name with ``classes`` as the label set's class order (figures.palette)."""
    return class_palette(classes)


def fmt_value(v: Any, digits: int = 3) -> str:
    """A number for hover text: ``digits`` significant digits, "–" for None or non-finite."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{v:.{digits}g}" if isinstance(v, float) else str(v)
