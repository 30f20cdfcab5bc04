"""The compare and timeline views' control groups: model A / B and top-k, series and top-k.

Text inputs (any model id or series; suggestions from the views' datalists, filled by
callbacks/compare.py), valued from the URL like every control (controls.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dash import dcc, html

from headgraph.frontend.api.names import Vocabulary
from headgraph.frontend.state.url import ViewState


def comparison_groups(state: ViewState | None, vocab: Vocabulary | None,
                      group: Callable[..., html.Div]) -> list[html.Div]:
    """The "compare" and "series" groups (``group(name, label, shown, *children)``)."""
    view = state.view if state else None
    k = state.k if state else None
    timeline_k_max = vocab.limits.timeline_edges_max if vocab else None

    def text(cid: str, value: str, placeholder: str, datalist: str, title: str) -> Any:
        return html.Span(dcc.Input(id=cid, type="text", value=value, placeholder=placeholder, debounce=True,
                                   list=datalist, className="text-input model-input"), title=title)

    return [
        group("compare", "A", view == "compare",
              text("compare-a-input", state.a if state else "", state.model if state else "model",
                   "compare-model-list", "model A (blank: the model above)"),
              html.Span("B", className="ctl-label"),
              text("compare-b-input", state.b if state else "", "e.g. demo@step-417", "compare-model-list",
                   "model B: same layers and heads as A"),
              html.Span("top-k", className="ctl-label"),
              dcc.Input(id="compare-k-input", type="number", min=1, max=vocab.k_max if vocab else None, step=1,
                        value=k, debounce=True, className="num-input")),
        group("series", "series", view == "timeline",
              text("series-input", state.series if state else "", "demo-series", "series-list",
                   "a named series, or model ids separated by commas"),
              html.Span("top-k", className="ctl-label"),
              dcc.Input(id="timeline-k-input", type="number", min=1, max=timeline_k_max, step=1,
                        value=min(k, timeline_k_max) if k and timeline_k_max else k, debounce=True, className="num-input")),
    ]
