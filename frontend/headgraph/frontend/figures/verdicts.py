"""How the head graph draws an edge's path-ablation verdict (the verification control).

verified (above the random-pair null): solid and bold in its pairing's colour; no effect:
dashed grey; not measured (or measured without its null yet): thin and faint in its pairing's
colour. One legend entry per verdict present, with its count.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from headgraph.frontend.api.answers import AblationEdge
from headgraph.frontend.figures.common import fmt_value, pairing_color

NO_EFFECT_COLOR = "rgba(120,124,130,0.75)"
# verdict -> (line width px, opacity factor on the pairing colour (None: grey), dash or None)
VERDICT_STYLES: dict[str, tuple[float, float | None, str | None]] = {
    "verified": (4.0, 1.0, None),
    "no effect": (1.8, None, "dash"),
    "not measured": (1.0, 0.35, None),
    "null not computed": (1.0, 0.35, None),
    "null too small": (1.0, 0.35, None),  # the null cannot resolve the quantile: no verdict
}
VERDICT_NAMES = {"verified": "verified: above the random-pair null",
                 "no effect": "no effect: not above the random-pair null"}
VERDICT_ORDER = tuple(VERDICT_STYLES)


def verdict_line(pairing: str, alpha: float, verdict: str, sink: bool) -> dict[str, Any]:
    """The Plotly ``line`` of an edge of ``pairing`` at opacity ``alpha`` with ``verdict``
    (a source that is an attention sink keeps its dotted line unless dashed by no effect)."""
    width, factor, dash = VERDICT_STYLES.get(verdict, VERDICT_STYLES["not measured"])
    if verdict == "verified":
        alpha = max(alpha, 0.6)  # a verified edge stays visible at any score
    color = NO_EFFECT_COLOR if factor is None else pairing_color(pairing, alpha * factor)
    return {"color": color, "width": width, "dash": dash or ("dot" if sink else "solid")}


def verdict_hover(row: AblationEdge | None) -> str:
    """Hover lines of an edge's verdict and effects (row: its GET /api/ablation edge)."""
    if not row or row.get("verdict") in (None, "not measured"):
        return "<br>ablation: not measured"
    measure = "TVD" if row.get("measure") == "tvd" else "relative output change"
    note = f"<br>{row['verdict_note']}" if row.get("verdict_note") else ""
    return (f"<br>ablation: <b>{row['verdict']}</b> ({measure} text {fmt_value(row.get('effect_text'))}, "
            f"random {fmt_value(row.get('effect_random'))}){note}")


def verdict_legend(fig: go.Figure, counts: dict[str, int], quantiles: list[float] | None = None) -> None:
    """Legend-only traces naming each verdict present with its edge count (``quantiles``: the
    null quantiles of the verdicts drawn, named in the verified and no-effect entries)."""
    q = f" (q={', '.join(f'{v:.4g}' for v in sorted(set(quantiles)))})" if quantiles else ""
    for verdict in VERDICT_ORDER:
        n = counts.get(verdict, 0)
        if not n:
            continue
        width, _, dash = VERDICT_STYLES[verdict]
        color = NO_EFFECT_COLOR if verdict == "no effect" else "rgba(60,60,60,%s)" % (
            "1" if verdict == "verified" else "0.35")
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", hoverinfo="skip",
                                 line=dict(color=color, width=width, dash=dash or "solid"),
                                 name=f"{VERDICT_NAMES[verdict] + q if verdict in VERDICT_NAMES else verdict} ({n})",
                                 legendgroup="verdict:" + verdict,
                                 showlegend=True, legendrank=3))
